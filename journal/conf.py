"""Every LOOM_* setting, its type, default and meaning: the one place they are declared.

Settings are read when used (not cached at import), so tests can override them. A value may
come from Django settings as a Python object or, through the project's environment loader, as a
string; either way it is coerced to the declared type here. A value that cannot be coerced is
reported by the system check `loom.E001` (see journal/checks.py), not deep inside a worker.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings


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


def _channel_problem(value: str) -> str | None:
    """A PostgreSQL channel name is an identifier: 1 to 63 bytes (NAMEDATALEN - 1); printable, so it reads
    the same in LISTEN, in logs and in pg_notify()."""
    size = len(value.encode("utf-8", "surrogatepass"))
    if not 1 <= size <= 63 or not value.isprintable():
        return f"is not a PostgreSQL channel name: 1 to 63 bytes of printable characters, got {size} bytes"
    return None


SETTINGS: dict[str, Setting] = {}


def _declare(*items: Setting) -> None:
    for item in items:
        SETTINGS[item.name] = item


_declare(
    # journal
    Setting("LOOM_MAX_PAYLOAD_BYTES", int, 1_048_576, "Largest JSON payload (bytes) an append accepts.", 1),
    Setting("LOOM_NOTIFY", bool, True, "On PostgreSQL, NOTIFY listeners of new stream tips after each append."),
    Setting("LOOM_NOTIFY_CHANNEL", str, "loom_journal",
            "PostgreSQL channel the journal notifies on (1 to 63 bytes of printable characters).",
            check=_channel_problem),
    Setting("LOOM_SNAPSHOT_EVERY", int, None, "Checkpoint an execution's state every N events (unset: never).", 1,
            optional=True),
    Setting("LOOM_COALESCE", bool, False, "Route appends of durable flows through the cross-stream coalescer."),
    Setting("LOOM_COALESCE_MAX_BATCH", int, 16, "Most rows the coalescer merges into one statement.", 1),
    Setting("LOOM_COALESCE_FLUSHERS", int, 2, "Flush threads (each with its own connection) per coalescer.", 1),
    # flows
    Setting("LOOM_FLOW_MODULES", list, [], "Modules imported at start-up so that their flows are registered."),
    # leases
    Setting("LOOM_LEASE_MODE", str, "lazy", "When a run takes its heartbeat lease: off, eager or lazy.",
            choices=("off", "eager", "lazy")),
    Setting("LOOM_LEASE_TTL", float, 30.0, "Seconds a lease lasts without renewal.", 0.05),
    Setting("LOOM_LEASE_RENEW_EVERY", float, 10.0, "Seconds between renewal ticks of a worker.", 0.01),
    Setting("LOOM_LEASE_LAZY_GRACE", float, None, "Seconds a fresh run goes unleased in lazy mode (unset: TTL/3).",
            0.0, optional=True),
    Setting("LOOM_LEASE_CHUNK", int, 500, "Leases renewed per renew_many statement.", 1),
    Setting("LOOM_RECOVERY_EVERY", float, 5.0, "Seconds between recovery sweeps of a worker.", 0.01),
    Setting("LOOM_RECOVERY_MAX_ATTEMPTS", int, 5, "Recoveries of one execution before it is marked stuck.", 1),
    Setting("LOOM_RECOVERY_BATCH", int, 16, "Executions one sweep takes over at most (resumed in parallel).", 1),
    Setting("LOOM_WORKER_ID", str, "", "Name of this worker (default: host:pid)."),
    Setting("LOOM_WORKER_RETENTION", float, 86400.0,
            "Seconds the workers page keeps a worker that stopped or vanished (pruned by loom_worker).", 0),
    # aggregates
    Setting("LOOM_AGGREGATE_CACHE_SIZE", int, 1000, "Aggregate states kept in each process's LRU cache.", 0),
    Setting("LOOM_AGGREGATE_MODULES", list, [], "Modules declaring aggregate states, imported for the admin."),
    # projections
    Setting("LOOM_DRAIN_LEASE_SECONDS", float, 10.0, "How long a drain holds the streams it claimed.", 0.01),
    Setting("LOOM_DRAIN_BATCH", int, 100, "Events fetched per claimed stream per drain cycle.", 1),
    Setting("LOOM_DRAIN_STREAMS", int, 10, "Streams one drain cycle claims at most.", 1),
    Setting("LOOM_DRAIN_RETRIES", int, 3, "Failures of a handler on one stream before it is blocked.", 1),
    Setting("LOOM_DRAIN_POLL_MS", int, 500, "Polling interval of a drain when no notification arrives.", 1),
    Setting("LOOM_DRAIN_LISTEN", bool, True,
            "On PostgreSQL, wake drains with LISTEN (turn off behind poolers that lack it)."),
    Setting("LOOM_DRAIN_RETRY_DELAY", float, 0.5, "Seconds a failed stream waits before its next attempt.", 0.0),
    Setting("LOOM_CORRELATE_HORIZON_SECONDS", float, 2.0,
            "Seconds after which a missing event id counts as rolled back (correlation checkpoint).", 0.0),
    Setting("LOOM_CORRELATE_BATCH", int, 5000, "Events one correlation scan reads per page.", 1),
    Setting("LOOM_PROJECTION_MODULES", list, [], "Modules imported at start-up that declare reactions/projections."),
    # HTTP API
    Setting("LOOM_API_TOKENS", list, [],
            "Bearer tokens accepted by the HTTP API: plain (full access) or scoped entries (docs/http-api.md)."),
    Setting("LOOM_API_AUTH", bool, True, "Require a token on the HTTP API (disable only for local benchmarks)."),
    Setting("LOOM_API_MAX_BODY_BYTES", int, 1_048_576, "Largest request body the HTTP API accepts.", 1),
    Setting("LOOM_API_EXAMPLES", bool, True, "Register loomapi's example flows (calc.add, calc.accumulate)."),
    Setting("LOOM_API_CALL_TIMEOUT", float, 30.0,
            "Seconds a transient API call may run before a 504 (its worker retires); unset: no bound.", 0.001,
            optional=True),
    Setting("LOOM_API_MAX_WAIT", float, 30.0, "Longest `wait=` (seconds) a durable start may ask for.", 0.0),
    # benchmarks
    Setting("LOOM_RESULTS_PUBLIC", bool, False,
            "Benchmark result pages need no login (default: staff only; runs name machines and commits)."),
)


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
            return list(value)
        return [part.strip() for part in str(value).split(",") if part.strip()]
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


def get(name: str) -> Any:
    """The current value of a LOOM_* setting, typed; raises ConfigError on a bad value."""
    item = SETTINGS[name]
    return _coerce(item, getattr(settings, name, item.default))


def lease_grace() -> float:
    """Lazy-mode grace: LOOM_LEASE_LAZY_GRACE, or a third of the TTL when unset."""
    grace = get("LOOM_LEASE_LAZY_GRACE")
    return get("LOOM_LEASE_TTL") / 3 if grace is None else grace


def problems() -> list[str]:
    """Every LOOM_* setting that does not coerce, for the system check."""
    found = []
    for item in SETTINGS.values():
        try:
            _coerce(item, getattr(settings, item.name, item.default))
        except ConfigError as exc:
            found.append(str(exc))
    if get_safe("LOOM_LEASE_RENEW_EVERY", 0) >= get_safe("LOOM_LEASE_TTL", 1e9):
        found.append("LOOM_LEASE_RENEW_EVERY must be shorter than LOOM_LEASE_TTL, or leases expire between renewals")
    return found


def get_safe(name: str, fallback: Any) -> Any:
    try:
        return get(name)
    except ConfigError:
        return fallback
