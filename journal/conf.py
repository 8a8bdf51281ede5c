"""The registry of LOOM_* settings, and the journal's own.

Each app declares the settings it owns in its own `conf` module (this one for the journal, its flows
and aggregates; `leases/conf.py`, `projections/conf.py`, `loomapi/conf.py`, `benchmarks/conf.py`),
which calls `register()` when imported; the app's `ready()` imports it. So the journal, the bottom
layer, knows no name above it, and a project without an app has none of its settings. Any module
reads any registered setting through `get()`, by name.

Settings are read when used (not at import) and the coerced value is kept until Django signals a
settings change (`setting_changed`: override_settings, pytest-django's `settings`), so tests can
override them. A value may
come from Django settings as a Python object or, through the project's environment loader, as a
string; either way it is coerced to the declared type here. A value that cannot be coerced is
reported by the system check `loom.E001` (see journal/checks.py), not deep inside a worker; so is
a broken rule between settings that an app registers with `rule()`. docs/configuration.md is
generated from this registry (`manage.py loom_settings --markdown`, every app installed).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver


@dataclass(frozen=True)
class Setting:
    name: str
    type: type
    default: Any
    doc: str
    minimum: float | None = None
    choices: tuple[str, ...] | None = None
    optional: bool = False  # None is a legal value ("unset")
    check: Callable[[Any], str | None] | None = None  # why a coerced value is unusable, or None
    app: str = ""  # the app label that registered it (set by register())


SETTINGS: dict[str, Setting] = {}
"""Every registered setting by name, in registration order (the order of docs/configuration.md)."""

RULES: list[Callable[[], list[str]]] = []
"""Checks across settings (renewal shorter than the TTL...), each returning what is wrong."""


class UnknownSetting(KeyError):
    """No installed app registers a LOOM_* setting of this name (is its app in INSTALLED_APPS?)."""


def register(app: str, *items: Setting) -> None:
    """Declare the settings `app` owns; its conf module calls this when imported.

    Registering a name again for the same app is harmless (a module imported twice); a name that two
    apps claim is a programming error, raised at start-up."""
    for item in items:
        known = SETTINGS.get(item.name)
        if known is not None and known.app != app:
            raise ValueError(f"{item.name} is declared by both {known.app!r} and {app!r}")
        SETTINGS[item.name] = replace(item, app=app)


def rule(check: Callable[[], list[str]]) -> Callable[[], list[str]]:
    """Register a check across settings, reported as loom.E001 (usable as a decorator)."""
    if check not in RULES:
        RULES.append(check)
    return check


def by_app() -> dict[str, list[Setting]]:
    """The registered settings grouped by the app that owns them, in registration order."""
    grouped: dict[str, list[Setting]] = {}
    for item in SETTINGS.values():
        grouped.setdefault(item.app, []).append(item)
    return grouped


def _channel_problem(value: str) -> str | None:
    """A PostgreSQL channel name is an identifier: 1 to 63 bytes (NAMEDATALEN - 1); printable, so it reads
    the same in LISTEN, in logs and in pg_notify()."""
    size = len(value.encode("utf-8", "surrogatepass"))
    if not 1 <= size <= 63 or not value.isprintable():
        return f"is not a PostgreSQL channel name: 1 to 63 bytes of printable characters, got {size} bytes"
    return None


def _key_problem(value: str) -> str | None:
    """LOOM_SHARD_KEY must import to a callable (checked at start-up, not at the first placement)."""
    if not value:
        return None
    from django.utils.module_loading import import_string

    try:
        fn = import_string(value)
    except ImportError as exc:
        return f"cannot be imported ({exc})"
    return None if callable(fn) else "is not callable"


def _disclose_groups_problem(value: list) -> str | None:
    """Each entry is `group:role`, both non-empty (the group's name may itself hold colons)."""
    for entry in value:
        if not isinstance(entry, str) or ":" not in entry or not all(entry.rsplit(":", 1)):
            return f"entries are 'group:role' strings, got {entry!r}"
    return None


register(
    "journal",
    Setting("LOOM_MAX_PAYLOAD_BYTES", int, 1_048_576, "Largest JSON payload (bytes) an append accepts.", 1),
    Setting("LOOM_NOTIFY", bool, True, "On PostgreSQL, NOTIFY listeners of new stream tips after each append."),
    Setting("LOOM_NOTIFY_CHANNEL", str, "loom_journal",
            "PostgreSQL channel the journal notifies on (1 to 63 bytes of printable characters).",
            check=_channel_problem),
    Setting("LOOM_SNAPSHOT_EVERY", int, None, "Checkpoint an execution's state every N events (unset: never).", 1,
            optional=True),
    Setting("LOOM_COALESCE", bool, True,
            "Merge concurrent writes (Event.objects.append, aggregates' do(), durable flows) into shared"
            " statements through the cross-stream coalescer; adaptive: a caller alone writes directly."),
    Setting("LOOM_COALESCE_MAX_BATCH", int, 16, "Most rows the coalescer merges into one statement.", 1),
    Setting("LOOM_COALESCE_FLUSHERS", int, 2, "Flush threads (each with its own connection) per coalescer.", 1),
    # flows
    Setting("LOOM_FLOW_MODULES", list, [], "Modules imported at start-up so that their flows are registered."),
    Setting("LOOM_EXPOSED_INTERNAL_FLOWS", list, [],
            "Internal flows (named `loom.*`, e.g. the Tasks backend's `loom.task`) that the HTTP API and the "
            "admin's schedule form may nevertheless start or call, by exact name; any other internal flow "
            "answers there as an unknown one (docs/security.md)."),
    Setting("LOOM_WORKER_ID", str, "", "Name of this worker (default: host:pid)."),
    Setting("LOOM_SHUTDOWN_GRACE", float, 30.0,
            "Seconds a worker given SIGTERM lets the steps already running finish (their completions recorded) "
            "before it hands every lease back and exits; a step still running then is interrupted and recovered "
            "elsewhere. Deploys wait at least this long before SIGKILL (docs/workers.md).", 0.0),
    Setting("LOOM_STEP_ABANDON_AFTER", float, 30.0,
            "Seconds a running step told to stop (cancelled, past its timeout or heartbeat timeout) may ignore it; "
            "then the worker's watchdog abandons its thread and the worker process retires and is replaced "
            "(journal/flows/interrupt.py).", 0.0),
    # flows that wait (journal/flows/waits.py)
    Setting("LOOM_WAIT_INLINE_MAX", float, 1.0,
            "Waits (sleep, retry backoff) shorter than this many seconds sleep in the running thread; "
            "longer ones park.",
            0.0),
    Setting("LOOM_WAIT_POLL", float, 1.0,
            "Seconds between two polls of the waker for due waits (a fallback to NOTIFY), and of get_event on SQLite.",
            0.01),
    Setting("LOOM_WAIT_BATCH", int, 16, "Due waits one claim takes at most (and the waker's resume threads).", 1),
    Setting("LOOM_ASYNC_DB_THREADS", int, 4,
            "Threads (one database connection each at most) that run the database work of the awaitable faces "
            "(astart, aget_event, ...: journal/flows/aio.py) for async callers, and each journal call of the async "
            "runs astart/aresume drive from the loop (their short sleeps hold none of them).", 1),
    Setting("LOOM_WAIT_CHANNEL", str, "loom_waits",
            "PostgreSQL channel on which waits made due and flow events are notified.", check=_channel_problem),
    Setting("LOOM_WAIT_RECHECK", float, 60.0,
            "A parent waiting for a child re-checks it at least this often (a net: the child's settle wakes "
            "it in the same transaction).", 0.01),
    # aggregates
    Setting("LOOM_AGGREGATE_CACHE_SIZE", int, 1000, "Aggregate states kept in each process's LRU cache.", 0),
    Setting("LOOM_AGGREGATE_MODULES", list, [], "Modules declaring aggregate states, imported for the admin."),
    # shards (journal/shards.py, docs/scaling.md)
    Setting("LOOM_SHARDS", list, [], "Database aliases the streams are spread over, in placement order "
            "(empty: the default database alone)."),
    Setting("LOOM_SHARD_HISTORY", list, [], "Earlier lengths of LOOM_SHARDS, ascending: streams created under "
            "them stay where they were placed (shards are only ever appended)."),
    Setting("LOOM_SHARD_KEY", str, "", "Dotted path of a function stream id -> partition key (e.g. "
            "journal.shards.prefix_key: a tenant's streams on one shard); empty: the whole id.",
            check=_key_problem),
    Setting("LOOM_PG_PREPARE", bool, True, "Let psycopg prepare the journal's statements (server-side). Off "
            "behind a pooler in transaction mode that cannot keep them (PgBouncer before 1.21)."),
    # personal data (docs/privacy.md)
    Setting("LOOM_KEYS", list, [], "Master keys as `id:base64` (32 bytes each); the first wraps new data keys, "
            "the others still unwrap old ones (rotation). Secret."),
    Setting("LOOM_KEY_SERVICE", str, "", "Dotted path of a key service class (an external KMS) used instead of "
            "LOOM_KEYS: `wrap(key) -> (master_id, wrapped)`, `unwrap(master_id, wrapped) -> key`."),
    Setting("LOOM_KEY_CACHE_SIZE", int, 10_000, "Unwrapped data keys kept in each process's LRU cache.", 0),
    Setting("LOOM_DISCLOSE_ROLES", list, ["privacy"], "Roles whose readers see every sensitive field (the "
            "admin gives a user the role `privacy` with the permission journal.disclose_personal_data)."),
    Setting("LOOM_DISCLOSE_GROUPS", list, [], "Admin users' roles from their Django groups, as `group:role` "
            "entries (a group's name alone grants no role; the role `privacy` comes from the permission "
            "journal.disclose_personal_data).", check=_disclose_groups_problem),
    Setting("LOOM_PRIVACY_ACCEPT_CLEAR", bool, False, "Read a stored event holding a field its type marks "
            "sensitive in clear (written before the field was marked) instead of refusing it as SealDowngraded. "
            "On only while such old events exist: it lets a downgrade by a database writer through too."),
    Setting("LOOM_CONTENT_THRESHOLD_BYTES", int, None, "Payloads whose JSON is larger go to the content store, "
            "the event keeping a reference (unset: none do, except Blob fields).", 1, optional=True),
    Setting("LOOM_CONTENT_STORAGE", str, "", "Name of the Django storage (settings.STORAGES) of the content "
            "store; empty: a FileSystemStorage in LOOM_CONTENT_DIR."),
    Setting("LOOM_CONTENT_DIR", str, "", "Directory of the default content store, an absolute path (a relative "
            "one follows each process's working directory: loom.W032); empty: <BASE_DIR>/var/loom-content, or "
            "<MEDIA_ROOT>/loom-content without settings.BASE_DIR."),
    Setting("LOOM_CONTENT_CACHE_SIZE", int, 1000, "Content items kept in each process's LRU cache.", 0),
    Setting("LOOM_TRACES", str, "off", "OpenTelemetry spans of runs, steps, waits, queue dispatches and API requests: "
            "off; otlp (the OTLP/HTTP exporter, configured by OTEL_EXPORTER_OTLP_*: pip install "
            "loom-django[telemetry-otlp]); jsonl (one JSON line per span appended to LOOM_TRACES_FILE); global (the "
            "project's own tracer provider). docs/observability.md.", choices=("off", "otlp", "jsonl", "global")),
    Setting("LOOM_TRACES_FILE", str, "loom-spans.jsonl", "The file LOOM_TRACES=jsonl appends spans to."),
    Setting("LOOM_TRACES_SERVICE", str, "loom", "The service.name of the spans' resource (otlp, jsonl)."),
    Setting("LOOM_METRICS", bool, False, "Collect Prometheus metrics and answer /metrics (loom_serve_api, loom_worker "
            "--metrics-port); set PROMETHEUS_MULTIPROC_DIR (an empty directory per service) for processes that fork "
            "workers. docs/observability.md."),
    Setting("LOOM_METRICS_AUTH", bool, True, "The API's /metrics asks for a token with access to every flow (its "
            "labels name every flow); false: no token (bind loom_serve_api where only Prometheus reaches it)."),
)


def _retention_flows_problem(value: list) -> str | None:
    """Each entry is `flow=days` (days a number >= 0, or `forever`); a flow named once."""
    from journal.retention import parse_flow_policies

    try:
        parse_flow_policies(value)
    except ValueError as exc:
        return str(exc)
    return None


def _duty_problem(value: float) -> str | None:
    """A finite pause factor (nan or inf would stop removal for good)."""
    return None if math.isfinite(value) else "must be a finite number >= 0"


def _compact_problem(value: list) -> str | None:
    """Entries are aggregate state names (or `*`), each once."""
    from journal.compaction import parse_compacted  # app registry: compaction imports conf (a cycle)

    try:
        parse_compacted(value)
    except ValueError as exc:
        return str(exc)
    return None


# Retention, archival (journal/retention.py, docs/retention.md).
register(
    "journal",
    Setting("LOOM_RETENTION_DAYS", float, None, "Days a settled (completed, failed, cancelled) execution is kept "
            "before the retention service removes it with its events, messages and flow events (unset: forever).",
            0, optional=True),
    Setting("LOOM_RETENTION_FLOWS", list, [], "Per-flow retention overriding LOOM_RETENTION_DAYS, as `flow=days` "
            "entries (`flow=forever` keeps that flow's executions).", check=_retention_flows_problem),
    Setting("LOOM_RETENTION_BATCH", int, 100, "Executions one removal batch (one transaction) removes at most.", 1),
    Setting("LOOM_RETENTION_EVERY", float, 60.0, "Seconds between two removal rounds of a worker's retention "
            "service (a round runs batches until nothing is due).", 0.1),
    Setting("LOOM_RETENTION_DUTY", float, 0.0, "Pacing of removal: after a batch that took t seconds, the remover "
            "pauses this * t before the next (0: none; 1: removal runs at most half the time), leaving the appends "
            "that share its cores, WAL and disk their share.", 0, check=_duty_problem),
    Setting("LOOM_RETENTION_RELAXED_COMMIT", bool, True, "Removal batches commit with synchronous_commit off "
            "(PostgreSQL): the commit does not wait for its WAL flush. A crash may lose the last batches: their "
            "executions stay whole and due, removed again later; their archive objects are refused by restore."),
    Setting("LOOM_ARCHIVE_FLOWS", list, [], "Flows whose executions are archived before removal (`*`: every flow)."),
    Setting("LOOM_ARCHIVE_STORAGE", str, "", "Name of the Django storage (settings.STORAGES) archives go to; empty: "
            "the content store's storage."),
    Setting("LOOM_ARCHIVE_PREFIX", str, "loom-archive", "Folder of the archive objects in that storage."),
    Setting("LOOM_COMPACT_AGGREGATES", list, [], "Aggregate states (declared names; `*`: every state) whose streams "
            "are compacted: the events before the newest snapshot deleted (journal/compaction.py). "
            "State(..., compact=True) does the same for one state.", check=_compact_problem),
    Setting("LOOM_COMPACT_BATCH", int, 1000, "Events one compaction batch (one transaction) deletes at most.", 1),
    Setting("LOOM_REINDEX_RATIO", float, None, "PostgreSQL: the retention service rebuilds (REINDEX INDEX "
            "CONCURRENTLY, one at a time) the indexes of journal_event once together they pass this many times its "
            "heap bytes (journal/reindex.py; unset: never).", 0.1, optional=True),
    Setting("LOOM_REINDEX_EVERY", float, 3600.0, "Seconds between two index checks of a worker's retention service "
            "(LOOM_REINDEX_RATIO).", 1.0),
)


@rule
def _keys_problem() -> list[str]:
    """LOOM_KEYS entries are `id:base64` of 32 bytes, ids distinct (journal/privacy/keys.py)."""
    from journal.privacy.keys import keys_problem

    problem = keys_problem(get_safe("LOOM_KEYS", []))
    return [] if problem is None else [f"LOOM_KEYS: {problem}"]


class ConfigError(ValueError):
    """A LOOM_* setting has a value that cannot be used."""


def _coerce(item: Setting, value: Any) -> Any:
    if value is None or value == "":
        if item.optional:
            return None
        if item.type is str:
            problem = item.check("") if item.check is not None else None
            if problem is not None:
                raise ConfigError(f"{item.name}='' {problem}")
            return ""
        raise ConfigError(f"{item.name} must be set")
    if item.type is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in {"1", "true", "yes", "on"}:
            return True
        if text in {"0", "false", "no", "off"}:
            return False
        raise ConfigError(f"{item.name}={value!r} is not a boolean")
    if item.type is list:
        if isinstance(value, (list, tuple)):
            items = list(value)
        else:
            items = [part.strip() for part in str(value).split(",") if part.strip()]
        problem = item.check(items) if item.check is not None else None
        if problem is not None:
            raise ConfigError(f"{item.name}={items!r} {problem}")
        return items
    try:
        result = item.type(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{item.name}={value!r} is not a {item.type.__name__}") from None
    if item.minimum is not None and result < item.minimum:
        raise ConfigError(f"{item.name}={result!r} is below its minimum {item.minimum}")
    if item.choices is not None and result not in item.choices:
        raise ConfigError(f"{item.name}={result!r} is not one of {', '.join(item.choices)}")
    if item.check is not None:
        problem = item.check(result)
        if problem is not None:
            raise ConfigError(f"{item.name}={result!r} {problem}")
    return result


_values: dict[str, Any] = {}
"""Coerced values read so far (not lists: a caller may change the list it gets). Hot paths read
settings per call (an append reads two or three); coercing each time cost ~1.5 µs a read."""


def get(name: str) -> Any:
    """The current value of a LOOM_* setting, typed; raises ConfigError on a bad value (UnknownSetting
    when no installed app registers the name)."""
    try:
        return _values[name]
    except KeyError:
        pass
    item = SETTINGS.get(name)
    if item is None:
        raise UnknownSetting(name)
    value = _coerce(item, getattr(settings, name, item.default))
    if item.type is not list:
        _values[name] = value
    return value


@receiver(setting_changed)
def _forget_values(**kwargs: Any) -> None:
    """A changed setting (override_settings, the tests' `settings` fixture) is read afresh."""
    _values.clear()


def problems() -> list[str]:
    """Every registered setting that does not coerce, and every broken rule, for the system check."""
    found = []
    for item in SETTINGS.values():
        try:
            _coerce(item, getattr(settings, item.name, item.default))
        except ConfigError as exc:
            found.append(str(exc))
    for check in RULES:
        found.extend(check())
    return found


def get_safe(name: str, fallback: Any) -> Any:
    """The value, or `fallback` when it is bad or its app is not installed (for checks and start-up)."""
    try:
        return get(name)
    except (ConfigError, UnknownSetting):
        return fallback
