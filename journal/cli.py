"""The verbs of `manage.py loom` (journal/management/commands/loom.py parses, this module acts).

    manage.py loom executions list --status failed --since 2h --json
    manage.py loom executions show ID | steps ID | cancel ID | resume ID | retry ID | fork ID --from-step N
    manage.py loom flows | replay | retention status | archive list

The journal names no app above it: each app contributes its nouns from its ready() with `add_cli_noun`
(queues: `queues`, `workers`, queues/cli.py; leases: `schedules`, leases/cli.py) and what it knows of one
execution with `add_cli_part` (its lease, its queue entry, its schedule tick, its errors that are refusals).

Every verb returns a `Reply`: the data (what `--json` prints) and the lines a person reads. Refusals
are our errors, turned into a `Refused` with the exit code scripts rely on (docs/cli.md):

    0 done; 1 refused or not found (NotResumable, ExecutionBusy, UnknownExecution...);
    2 usage (bad option, bad --since); 3 not available in this installation (fork without the
    flows-that-wait work, --queue without the queues app, --schedule without leases).

Everything goes through journal.flows (cancel, hand_over, retry_execution) and the models' reads, on
the database alias given (--database), never a default assumed. With LOOM_SHARDS and no --database, a
verb on one execution acts on its shard (journal/shards.py) and `executions list` and `queues` read every
shard (docs/cli.md).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.apps import apps
from django.db import DEFAULT_DB_ALIAS
from django.utils import timezone

from journal import shards
from journal.exceptions import DatabaseUnavailable
from journal.timestamps import stamp

OK, REFUSED, USAGE, UNAVAILABLE, UNREACHABLE = 0, 1, 2, 3, 4
MAX_LIMIT = 10_000
SINCE = re.compile(r"(\d+)([smhd])\Z")
UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


@dataclass
class Reply:
    """What a verb answers: `data` for --json, `lines` for a person."""

    data: Any
    lines: list[str] = field(default_factory=list)


class Refused(Exception):
    """A verb that did nothing: the message and the exit code (1 refused/not found, 2 usage, 3 unavailable, 4 the
    database could not be reached)."""

    def __init__(self, message: str, code: int = REFUSED, kind: str = "", data: Any = None,
                 lines: list[str] | None = None):
        self.code, self.kind = code, kind
        self.data, self.lines = data, lines or []  # what was found before refusing (replay: every result)
        super().__init__(message)


def unreachable(error: BaseException) -> Refused:
    """The refusal of a verb whose database (a shard) could not be reached (journal/reach.py): exit 4, naming
    each journal database that does not answer now (each probed once), never a traceback. An open connection is
    asked `SELECT 1` first (is_usable): one the server dropped is closed and reopened, so it is named while the
    server is gone, and not left behind broken when it is back."""
    from django.db import DEFAULT_DB_ALIAS, InterfaceError, OperationalError, connections

    def first(exc: BaseException) -> str:
        return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]

    down = {}
    for alias in dict.fromkeys([*shards.shards(), DEFAULT_DB_ALIAS]):
        connection = connections[alias]
        try:
            if connection.connection is not None and not connection.is_usable():
                connection.close()  # open but dead (ensure_connection would keep it): dropped, so we reconnect
            connection.ensure_connection()
        except (OperationalError, InterfaceError) as exc:
            down[alias] = first(exc)
    said = "; ".join(f"{alias}: {reason}" for alias, reason in down.items()) or first(error)
    return Refused(f"the database could not be reached ({said}); retry once it answers (a cancel, resume or retry "
                   f"whose write was in flight is answered as done or refused when repeated)", UNREACHABLE,
                   "DatabaseUnavailable", data={"unreachable": sorted(down)})


@dataclass(frozen=True, slots=True)
class Noun:
    """One noun of `manage.py loom`: its parser's arguments and the function that acts on the parsed options."""

    name: str
    add_arguments: Callable[[Any], None]  # (the noun's subparser) -> None; `options(sub)` adds --json, --database
    dispatch: Callable[[dict, str | None], Reply]  # (parsed options, checked alias or None) -> Reply
    help: str
    place: int  # its place in the noun list of `loom --help`


NOUNS: dict[str, Noun] = {}
"""The nouns of `manage.py loom`, by name: the journal's, and those the apps above add from their ready()."""


def add_cli_noun(name: str, add_arguments: Callable[[Any], None], dispatch: Callable[[dict, str | None], Reply],
                 help: str, place: int = 100) -> None:
    """Offer `manage.py loom NAME` (an app's ready() calls this; registering a name again replaces it)."""
    NOUNS[name] = Noun(name, add_arguments, dispatch, help, place)


def nouns() -> list[Noun]:
    """The registered nouns in their places."""
    return sorted(NOUNS.values(), key=lambda noun: noun.place)


def options(sub):
    """Add the options every verb takes (--json, --database) to a verb's parser; returns it."""
    sub.add_argument("--json", action="store_true", help="Print one JSON document.")
    sub.add_argument("--database", default=None, help="The database alias (default: the default database; with "
                     "LOOM_SHARDS an execution's shard, every shard for lists).")
    return sub


@dataclass(slots=True)
class Parts:
    """What the apps above tell the execution verbs, each filled from its app's ready() by `add_cli_part`
    (None: that app is not installed, and the verbs say so or leave the part out)."""

    lease: Callable[[str, str], dict | None] | None = None  # (alias, id): owner, fence_token, expires_at, expired
    queue_entry: Callable[[str, str], dict | None] | None = None  # (alias, id): queue, state, priority...
    queued_ids: Callable[[str, str], Any] | None = None  # (alias, queue): a query of its entries' execution ids
    cancel_pending: Callable[[str, str], bool] | None = None  # (alias, id): a pending entry cancelled before it ran
    schedule_prefix: str | None = None  # the id prefix of executions a schedule started ("<prefix><name>:<tick>")
    refusals: tuple[type[Exception], ...] = ()  # errors that are refusals (exit 1), not tracebacks


PARTS = Parts()


def add_cli_part(**parts: Any) -> None:
    """Fill parts of `PARTS` (an app's ready() calls this); `refusals=` adds to the errors already named."""
    for name, value in parts.items():
        if name == "refusals":
            value = (*PARTS.refusals, *(one for one in value if one not in PARTS.refusals))
        elif not hasattr(PARTS, name):
            raise TypeError(f"add_cli_part: no part {name!r} (one of {', '.join(Parts.__dataclass_fields__)})")
        setattr(PARTS, name, value)


def iso(value: datetime | None) -> str | None:
    """A time as --json prints it: ISO 8601 in UTC (None stays None)."""
    return None if value is None else value.astimezone(UTC).isoformat()


def parse_since(text: str, now: datetime | None = None, option: str = "--since") -> datetime:
    """`30s`, `15m`, `2h`, `7d` ago, or an ISO 8601 time (UTC unless it says otherwise); Refused (usage)."""
    match = SINCE.match(text.strip())
    if match:
        try:
            return (now or timezone.now()) - timedelta(**{UNITS[match[2]]: int(match[1])})
        except OverflowError:
            raise Refused(f"{option} {text!r}: further back than a datetime goes", USAGE) from None
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise Refused(f"{option} {text!r}: an ISO time (2026-12-01T10:00) or an age (30s, 15m, 2h, 7d)",
                      USAGE) from None
    moment = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    try:  # the database compares in UTC: 0001-01-01T00:00+14:00 is before year 1 there (an OverflowError)
        moment.astimezone(UTC)
    except OverflowError:
        raise Refused(f"{option} {text!r}: outside the times a datetime holds in UTC", USAGE) from None
    return moment


def acting(fn):
    """Turn our errors into Refused (exit 1): the verbs let journal.flows decide what is allowed."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from journal.flows.errors import UnknownExecution

        try:
            return fn(*args, **kwargs)
        except Refused:
            raise
        except DatabaseUnavailable as exc:  # a JournalError, but not a refusal: in doubt, retry (exit 4)
            raise unreachable(exc) from None
        except UnknownExecution as exc:
            raise Refused(str(exc), REFUSED, "UnknownExecution") from None
        except _refusals() as exc:
            raise Refused(str(exc), REFUSED, type(exc).__name__) from None

    return wrapper


def _refusals() -> tuple[type[Exception], ...]:
    """Our errors (the journal's; those the apps added, e.g. the queues app's QueueError): a refusal, never a
    traceback."""
    from journal.exceptions import JournalError

    return (JournalError, *PARTS.refusals)


def _flows_alias(using: str) -> None:
    """journal.flows reads and writes the journal where the routers put it: acting on another alias
    would silently act on that one, so it is refused."""
    from django.db import router

    from journal.models import Execution

    if using != router.db_for_write(Execution):
        raise Refused(f"--database {using!r}: this verb goes through journal.flows, which uses the database "
                      f"{router.db_for_write(Execution)!r} (the routers decide)", USAGE)


def _home(using: str | None, execution_id: str) -> str:
    """The database of one execution's rows (header, lease, queue entry): its shard with LOOM_SHARDS (a
    --database naming another shard is refused: nothing of it is there), else the alias given."""
    _check_id(execution_id)
    if not shards.sharded():
        alias = using or DEFAULT_DB_ALIAS
        _flows_alias(alias)
        return alias
    alias = shards.shard_for(execution_id)
    if using is not None and using != alias:
        raise Refused(f"--database {using!r}: execution {execution_id!r} lives on shard {alias!r} (LOOM_SHARDS); "
                      "leave --database out", USAGE)
    return alias


def _aliases(using: str | None) -> list[str]:
    """The databases a listing reads: the alias given, else every shard (the default database unsharded)."""
    if using is not None:
        return [using]
    return shards.shards() if shards.sharded() else [DEFAULT_DB_ALIAS]


def _check_id(execution_id: str) -> str:
    return _check_text("execution id", execution_id)


def _check_text(what: str, value: str) -> str:
    """A name or id the database can hold as text (no NUL, no lone surrogate from a mangled argv, at
    most 200 characters): anything else is a usage error, before any query."""
    from journal.ids import stored_id_problem

    problem = stored_id_problem(value)
    if problem is not None:
        raise Refused(f"{what} {ascii(value)[:80]}: {problem}", USAGE)
    return value


def _unstorable(text: str) -> bool:
    """Free text the database cannot hold: a NUL, or a lone surrogate (argv bytes that are not UTF-8)."""
    return "\x00" in text or any("\ud800" <= ch <= "\udfff" for ch in text)


def check_alias(using: str | None) -> str | None:
    """A database alias of the settings (an unknown one is a usage error, not a traceback); None: not given."""
    from django.db import connections

    if using is not None and using not in connections.settings:
        raise Refused(f"--database {using!r}: not in DATABASES ({', '.join(connections.settings)})", USAGE)
    return using


# -- executions list ------------------------------------------------------------------------------------
def list_executions(using: str | None, *, status: str | None = None, flow: str | None = None, queue: str | None = None,
                    schedule: str | None = None, since: str | None = None, stuck: bool = False,
                    limit: int = 50, search: str | None = None, until: str | None = None) -> Reply:
    """The newest executions matching every filter given (`--stuck`: recovery gave up, or running
    with a lease that expired and nobody took over yet). With LOOM_SHARDS and no alias: every shard's
    newest `limit`, merged newest first (each row names its shard). `--search` is the admin's search
    (journal/search.py: id, flow, input text, error text); `--until` ends the created range `--since` opens."""
    from journal.search import error_line
    from journal.search import search as narrowed

    if not 1 <= limit <= MAX_LIMIT:
        raise Refused(f"--limit is 1 to {MAX_LIMIT}", USAGE)
    for option, value in (("--flow", flow), ("--queue", queue), ("--schedule", schedule), ("--search", search)):
        if value is not None:
            _check_text(option, value)
    since_at = parse_since(since) if since else None
    until_at = parse_since(until, option="--until") if until else None
    found = []
    for alias in _aliases(using):
        rows = _matching(alias, status, flow, queue, schedule, since_at, stuck)
        if until_at is not None:
            rows = rows.filter(created_at__lt=until_at)
        if search:
            rows = narrowed(rows, search)
        found += [{**row, "shard": alias} if shards.sharded() else row for row in _with_task(
            rows.values("id", "flow", "status", "created_at", "finished_at", "recoveries", "input", "error")[:limit])]
    found.sort(key=lambda row: row["id"])
    found.sort(key=lambda row: row["created_at"], reverse=True)  # stable: newest first, then by id
    found = found[:limit]
    data = [{**row, "error": row["error"] or None, "created_at": iso(row["created_at"]),
             "finished_at": iso(row["finished_at"])} for row in found]
    lines = table(["id", "flow", "status", "created", "finished", "error"],
                  [[r["id"], r["task"] or r["flow"], r["status"], stamp(r["created_at"]),
                    stamp(r["finished_at"]) or "-", _error_cell(r, error_line)] for r in found])
    if len(found) == limit:
        lines.append(f"(the newest {limit}; --limit to see more)")
    return Reply(data, lines or ["no executions"])


def _error_cell(row: dict, error_line) -> str:
    """The list's error column: the error's first line; a cancel's reason is said to be one."""
    if not row["error"]:
        return "-"
    if row["status"] == "cancelled":
        return f"(cancelled: {error_line(row['error'], 60)})"
    return error_line(row["error"], 100)


def _with_task(rows) -> list[dict]:
    """Rows without their input, each with "task": a Django task's verified dotted name (journal/task_names.py;
    the list's flow column shows it), else None."""
    from journal.task_names import shown_flow

    found = []
    for row in rows:
        data = dict(row)
        shown = shown_flow(data["flow"], data.pop("input"), data["id"])
        found.append({**data, "task": shown if shown != data["flow"] else None})
    return found


def _matching(using: str, status: str | None, flow: str | None, queue: str | None, schedule: str | None,
              since: datetime | None, stuck: bool):
    """One database's executions matching the filters, newest first (a queue entry is on its execution's
    database, so the queue filter is one subquery there)."""
    from django.db.models import Q

    from journal.models import Execution

    rows = Execution.objects.using(using).order_by("-created_at", "id")
    if status:
        if status not in Execution.Status.values:
            raise Refused(f"--status {status!r}: one of {', '.join(Execution.Status.values)}", USAGE)
        rows = rows.filter(status=status)
    if flow:
        from journal.task_names import flow_q

        rows = rows.filter(flow_q(flow))  # a flow, or a Django task's dotted name
    if since:
        rows = rows.filter(created_at__gte=since)
    if schedule:
        if PARTS.schedule_prefix is None:
            raise Refused("--schedule needs the leases app (add \"leases\" to INSTALLED_APPS)", UNAVAILABLE)
        rows = rows.filter(id__startswith=f"{PARTS.schedule_prefix}{schedule}:")
    if queue:
        if PARTS.queued_ids is None:
            raise Refused("--queue needs the queues app (add \"queues\" to INSTALLED_APPS)", UNAVAILABLE)
        rows = rows.filter(pk__in=PARTS.queued_ids(using, queue))
    if stuck:
        lapsed = Q(status="running")
        if apps.is_installed("leases"):
            lapsed &= Q(lease__expires_at__lt=timezone.now())
        rows = rows.filter(Q(status="stuck") | lapsed)
    return rows


def table(head: list[str], rows: list[list[str]]) -> list[str]:
    """Left-aligned columns under `head` for a person (no rows: no lines, the verb says "no ...")."""
    if not rows:
        return []
    widths = [max(len(str(v)) for v in col) for col in zip(head, *rows, strict=True)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*head).rstrip(), *(fmt.format(*map(str, row)).rstrip() for row in rows)]


# -- show / steps -----------------------------------------------------------------------------------------
@acting
def show(using: str | None, execution_id: str, reveal: bool = False) -> Reply:
    """Header, lease, fence, queue entry and timeline of one execution; sensitive fields redacted unless
    `reveal` (see _describe)."""
    using = _home(using, execution_id)
    view = _describe(using, execution_id, reveal)
    lease = _lease(using, execution_id)
    entry = _entry(using, execution_id)
    data = {
        "execution_id": execution_id, "flow": view["flow"], "status": view["status"],
        "header_status": view["header_status"], "input": view["input"], "result": view["result"],
        "error": view["error"], "created_at": iso(view["created_at"]), "finished_at": iso(view["finished_at"]),
        "fence": view["fence"], "snapshot_seq": view["snapshot_seq"], "lease": lease, "queue": entry,
        "schedule": _schedule_of(execution_id), "steps": _steps(view["steps"]),
    }
    if shards.sharded():
        data["shard"] = using
    from journal.task_names import shown_flow

    shown = shown_flow(view["flow"], view["input"], execution_id)
    flow_line = shown if shown == view["flow"] else f"{shown} (task, flow {view['flow']})"
    lines = [f"execution {execution_id}", f"  flow      {flow_line}", f"  status    {data['status']}",
             f"  created   {stamp(view['created_at'])}", f"  finished  {stamp(view['finished_at']) or '-'}",
             f"  fence     {data['fence']}"]
    if lease:
        lines.append(f"  lease     {lease['owner']} at fence {lease['fence_token']}, expires {lease['expires_at']}"
                     + (" (expired)" if lease["expired"] else ""))
    else:
        lines.append("  lease     none")
    if entry:
        lines.append(f"  queue     {entry['queue']} ({entry['state']})")
    if data["schedule"]:
        lines.append(f"  schedule  {data['schedule']['name']} (tick {data['schedule']['tick']})")
    if data["error"]:
        lines.append(f"  error     {data['error']}")
    lines += ["", "timeline:", *_step_lines(data["steps"])]
    return Reply(data, lines)


@acting
def steps(using: str | None, execution_id: str, reveal: bool = False) -> Reply:
    """The timeline of one execution: one row per step attempt (sensitive fields redacted unless `reveal`)."""
    rows = _steps(_describe(_home(using, execution_id), execution_id, reveal)["steps"])
    return Reply(rows, _step_lines(rows))


def _describe(using: str, execution_id: str, reveal: bool = False) -> dict:
    """The execution as describe() reads it. Its sensitive fields (docs/privacy.md) are `<redacted>` as for an
    admin user without a disclosure role, so that a terminal, a pasted output or a CI log shows no personal
    data by default; `reveal` (the `--reveal` flag, for an operator allowed to see them) reads them in clear."""
    from journal.flows.describe import describe
    from journal.privacy import Reader

    reader = None if reveal else Reader("", frozenset())  # None: the system, everything; else: withhold all
    return describe(_check_id(execution_id), reader)  # on its shard (describe binds it); `using` is that shard


def _steps(rows: list[dict]) -> list[dict]:
    return [{"pos": r["pos"], "step": r["step"], "attempt": r["attempt"], "status": r["status"], "ms": r["ms"],
             "started_at": iso(r.get("started_at")), "result": r["result"], "error": r["error"], "note": r["note"],
             **({"traceback": r["traceback"]} if r.get("traceback") else {})}
            for r in rows]


def _step_lines(rows: list[dict]) -> list[str]:
    found = table(["pos", "step", "attempt", "status", "ms", "note"],
                  [[r["pos"], r["step"], r["attempt"], r["status"], "" if r["ms"] is None else r["ms"],
                    r["error"] or r["note"]] for r in rows])
    return found or ["(no steps)"]


def _lease(using: str, execution_id: str) -> dict | None:
    """Its lease row as the leases app reads it (leases/cli.py); None without leases or without a row."""
    return None if PARTS.lease is None else PARTS.lease(using, execution_id)


def _entry(using: str, execution_id: str) -> dict | None:
    """Its queue entry as the queues app reads it (queues/cli.py); None without queues or without an entry."""
    return None if PARTS.queue_entry is None else PARTS.queue_entry(using, execution_id)


def _schedule_of(execution_id: str) -> dict | None:
    prefix = PARTS.schedule_prefix
    if prefix is None or not execution_id.startswith(prefix) or execution_id.count(":") < 2:
        return None
    name, _, tick = execution_id[len(prefix):].partition(":")
    return {"name": name, "tick": tick}


# -- cancel / resume / retry / fork ------------------------------------------------------------------------
@acting
def cancel(using: str | None, execution_id: str, reason: str = "") -> Reply:
    """Cancel through journal.flows.cancel (a pending queue entry is cancelled before it starts)."""
    from journal.flows import cancel as cancel_execution
    from journal.flows.writer import header_status

    using = _home(using, execution_id)
    if _unstorable(reason):
        raise Refused("--reason: text the database can hold (no NUL, no lone surrogate)", USAGE)
    header = header_status(execution_id)
    if header is None and PARTS.cancel_pending is not None:  # an entry written before queued executions
        if PARTS.cancel_pending(using, execution_id):
            return Reply({"execution_id": execution_id, "status": "cancelled", "queued": True},
                         [f"cancelled {execution_id} (it was queued, not started)"])
        entry = _entry(using, execution_id)
        if entry is not None and entry["state"] == "started" and header_status(execution_id) is None:
            # Begun by its worker (cancel_pending refuses once the runner's begin won) but its run has not
            # written its first event yet: there is nothing to cancel yet. Say so (not "does not exist").
            raise Refused(f"execution {execution_id!r} was just taken from queue {entry['queue']!r} by a worker "
                          "and has not begun; cancel it again in a moment, once it exists", REFUSED, "NotBegun")
    out = cancel_execution(execution_id, reason or "cancelled from the command line (manage.py loom)")
    if header is not None and header[0] == "queued":  # its entry is cancelled with it: it never begins
        return Reply({"execution_id": execution_id, "status": out.status, "reason": out.error, "queued": True},
                     [f"cancelled {execution_id} (it was queued, not started)"])
    return Reply({"execution_id": execution_id, "status": out.status, "reason": out.error},
                 [f"{execution_id}: {out.status}"])


@acting
def resume(using: str | None, execution_id: str, force: bool = False) -> Reply:
    """Hand the execution to a worker (journal.flows.hand_over): never run in this process."""
    from journal.flows import hand_over

    _home(using, execution_id)
    token = hand_over(_check_id(execution_id), force=force)
    return Reply({"execution_id": execution_id, "handed_over": True, "fence": token, "forced": force},
                 [f"{execution_id}: handed over to a worker (from fence {token})" + (" [forced]" if force else "")])


@acting
def retry(using: str | None, execution_id: str, actor: str = "") -> Reply:
    """A new attempt of a failed execution, recorded in its log, handed to a worker."""
    from journal.flows.runtime import retry as retry_execution

    _home(using, execution_id)
    retry_execution(_check_id(execution_id), actor=actor or "manage.py loom", handoff=True)
    return Reply({"execution_id": execution_id, "retried": True, "handed_over": True},
                 [f"{execution_id}: a new attempt was recorded and handed over to a worker"])


@acting
def fork(using: str | None, execution_id: str, from_step: int, new_id: str | None = None) -> Reply:
    """A new execution replaying the first `from_step` steps (the flows-that-wait work's journal.flows.fork)."""
    import journal.flows as flows

    try:
        fork_execution = flows.fork
    except AttributeError:
        raise Refused("fork is not available in this installation: it comes with durable flows that wait "
                      "(journal.flows.fork, issue 17), which is not installed here", UNAVAILABLE) from None
    if from_step < 0:
        raise Refused("--from-step is 0 or more", USAGE)
    _home(using, execution_id)
    if new_id is not None:
        _check_text("--new-id", new_id)
    forked = fork_execution(_check_id(execution_id), from_step, new_id)
    return Reply({"execution_id": execution_id, "forked": forked, "from_step": from_step},
                 [f"{execution_id}: forked as {forked} from step {from_step}"])


# -- flows / replay / export (docs/flows.md "Versions", "The replay check") ---------------------------------
def flows(using: str | None, flow: str | None = None) -> Reply:
    """Per flow and version: registered in this process or not, and its live (unsettled) executions by
    status, every shard counted (or `using`): a version with none may leave the code."""
    from journal.flows.versions import live_versions

    if flow is not None:
        _check_text("--flow", flow)
    found = live_versions(_aliases(using), flow)
    lines = table(["flow", "version", "here", "live", "by status", "retire"],
                  [[v.flow, v.version, "yes" if v.registered else "no", v.live_total,
                    ", ".join(f"{s}: {n}" for s, n in v.live.items()) or "-",
                    "safe" if v.retirable else "not yet"] for v in found])
    return Reply([v.as_json() for v in found], lines or ["no flows registered and no live executions"])


@acting
def export(using: str | None, execution_id: str) -> Reply:
    """One execution's recorded history as JSON (what `replay --file` reads); the data is the document."""
    from journal.flows.replay import history_of

    _home(using, execution_id)
    history = history_of(_check_id(execution_id)).to_json()
    return Reply(history, [json.dumps(history, indent=2, sort_keys=True, ensure_ascii=False)])


def replay(using: str | None, execution_ids: list[str], *, files: list[str] | None = None,
           flows: list[str] | None = None, last: int = 20, settled: bool = False) -> Reply:
    """Replay recorded histories against the code of this process, writing nothing; Refused (exit 1) naming
    the first execution and position a resume would refuse, with every result in its data."""
    from journal.flows import replay as replaying
    from journal.flows.errors import UnknownExecution

    if not 1 <= last <= MAX_LIMIT:
        raise Refused(f"--last is 1 to {MAX_LIMIT}", USAGE)
    for name in flows or []:
        _check_text("--flow", name)
    try:
        histories = [replaying.load_file(path) for path in files or []]
    except replaying.InvalidHistory as exc:
        raise Refused(str(exc), USAGE, "InvalidHistory") from None
    ids = [_check_id(eid) for eid in execution_ids]
    if not ids and not histories:
        for alias in _aliases(using):
            ids += replaying.recent_ids(flows, last, settled, [alias])
    try:
        results = replaying.replay(ids, histories=histories) if ids or histories else []
    except UnknownExecution as exc:
        raise Refused(str(exc), REFUSED, "UnknownExecution") from None
    data = [result.as_json() for result in results]
    lines = [result.line() for result in results]
    failures = [result for result in results if not result.ok]
    summary = f"{len(results)} history(ies) replayed, {len(failures)} would not resume on this code"
    if failures:
        first = failures[0]
        where = "" if first.position is None else f" at position {first.position}"
        raise Refused(f"{summary}; the first: {first.execution_id}{where}: {first.reason}", REFUSED,
                      first.problem, data=data, lines=lines)
    return Reply(data, [*lines, summary])


def retention(using: str | None, verb: str, max_batches: int | None = None) -> Reply:
    """`loom retention status`: due per policy and the newest batches, per shard; `run`: remove what is due;
    `compact`: compact the compacted states' aggregate streams (journal/compaction.py)."""
    from journal import compaction, conf  # app registry: read at use, as retention is
    from journal import retention as kept

    aliases = _aliases(using)
    if max_batches is not None and max_batches < 1:
        raise Refused(f"--max-batches must be at least 1, got {max_batches}", USAGE)
    if verb == "compact":
        try:
            done, down = compaction.run_each(aliases, max_batches=max_batches)
        except conf.ConfigError as exc:
            raise Refused(str(exc), kind="ConfigError") from None
        lines = [f"{alias}: compacted {t['streams']} stream(s), {t['events']} event(s), {t['snapshots']} older "
                 f"snapshot(s) in {t['batches']} batch(es)" for alias, t in done.items()]
        if down:  # the others were compacted: say so, and exit 4 naming the shards not reached
            raise _partly_unreachable(done, down, lines, "compacted")
        return Reply(done, lines)
    down: dict[str, str] = {}  # a shard that does not answer: named, the others still done (exit 4 after them)
    if verb == "run":
        done = dict(shards.read_each(aliases, lambda alias: (alias, kept.run(alias, max_batches=max_batches)), down))
        lines = [f"{alias}: removed {t['executions']} execution(s), {t['events']} event(s), {t['messages']} "
                 f"message(s), {t['flow_events']} flow event(s) in {t['batches']} batch(es)"
                 for alias, t in done.items()]
        if down:
            raise _partly_unreachable(done, down, lines, "removed from")
        return Reply(done, lines)

    def both(alias: str) -> dict:
        one = kept.status(alias)
        try:
            one["compaction"] = compaction.status(alias)
        except conf.ConfigError as exc:
            raise Refused(str(exc), kind="ConfigError") from None
        return one

    found = shards.read_each(aliases, both, down)
    lines = []
    for one in found:
        lines.append(f"{one['alias']}:")
        if not one["due"]:
            lines.append("  no retention configured (LOOM_RETENTION_DAYS, LOOM_RETENTION_FLOWS): nothing is removed")
        lines += [f"  {d['policy']}: {d['days']:g} day(s), {d['due']} due" for d in one["due"]]
        if one["forever"]:
            lines.append(f"  kept forever: {', '.join(one['forever'])}")
        lines += [f"  removed #{r['id']} {r['removed_at']}: {r['executions']} execution(s), {r['events']} event(s)"
                  + (f", archive {r['archive']}" if r["archive"] else "") for r in one["removed"]]
        compacted = one["compaction"]
        lines.append(f"  compacted states: {', '.join(compacted['states']) or 'none'}")
        lines += [f"  compacted #{c['id']} {c['compacted_at']}: {c['stream']} before seq {c['before_seq']}, "
                  f"{c['events']} event(s)" for c in compacted["compacted"]]
    if down:
        raise _partly_unreachable({"shards": found}, down, lines, "read")
    return Reply(found, lines)


def resnapshot(using: str | None, *, state: str | None = None, stream: str | None = None, everything: bool = False,
               dry_run: bool = False, batch: int = 100, progress: Callable[[str], None] | None = None) -> Reply:
    """`loom aggregates resnapshot`: fresh snapshots from this code where the newest one no longer fits (`--all`:
    every snapshotted stream), every shard (journal/aggregates/resnapshot.py). Exit 1 naming the streams refused (a
    compacted stream whose snapshot does not fit) or failed, after every other stream was done; exit 4 naming a
    shard not reached, the others done."""
    from journal.aggregates import resnapshot as redo  # app registry: the aggregates import the models

    if state is not None:
        _check_text("--state", state)
    if stream is not None:
        _check_text("--stream", stream)
    if not 1 <= batch <= MAX_LIMIT:
        raise Refused(f"--batch is 1 to {MAX_LIMIT}", USAGE)
    if using is not None and not shards.sharded():
        _flows_alias(using)  # the aggregates read and write where the routers put the journal
    elif using is not None and using not in shards.shards():
        raise Refused(f"--database {using!r}: not one of LOOM_SHARDS ({', '.join(shards.shards())})", USAGE)
    if stream is not None and shards.sharded() and using is not None and using != shards.shard_for(stream):
        raise Refused(f"--database {using!r}: stream {stream!r} lives on shard {shards.shard_for(stream)!r} "
                      "(LOOM_SHARDS); leave --database out", USAGE)
    try:
        report = redo.run(_aliases(using), state=state, stream=stream, everything=everything, dry_run=dry_run,
                          batch=batch, progress=progress)
    except redo.UnknownTarget as exc:
        raise Refused(str(exc), REFUSED, "UnknownState" if stream is None else "UnknownStream") from None
    data = report.as_json()
    lines = [f"{name}: skipped, {why}" for name, why in report.skipped_states.items()]
    lines += [f"{o.alias}: {o.stream}: {o.action}" + (f" at seq {o.seq}" if o.seq is not None else "")
              + (f" ({o.reason})" if o.reason else "") for o in report.outcomes]
    verb = "would be re-snapshotted" if dry_run else "re-snapshotted"
    done = data["would_resnapshot"] if dry_run else data["resnapshotted"]
    lines.append(f"{report.checked} stream(s) checked: {done} {verb}, {report.fits} fit and kept, "
                 f"{data['refused']} refused, {data['failed']} failed")
    problems = [o for o in report.outcomes if o.problem]
    if problems:
        first = problems[0]
        raise Refused(f"{len(problems)} stream(s) not re-snapshotted; the first: {first.stream}: {first.reason}",
                      REFUSED, "CompactedStream" if first.action == "refused" else "NotRefolded", data=data,
                      lines=lines)
    if report.unreachable:
        raise _partly_unreachable(data, report.unreachable, lines, "re-snapshotted")
    return Reply(data, lines)


def _partly_unreachable(done: dict, down: dict[str, str], lines: list[str], what: str) -> Refused:
    """Exit 4 for a verb that acted on every shard it reached: the lines and data of those, and the shards that
    could not be reached named (retry once they answer; what was done stays done)."""
    said = "; ".join(f"{alias}: {reason}" for alias, reason in down.items())
    lines = [*lines, *(f"{alias}: not reached ({reason})" for alias, reason in down.items())]
    return Refused(f"{', '.join(down)} could not be reached ({said}); the other shard(s) were {what}; retry once it "
                   f"answers", UNREACHABLE, "DatabaseUnavailable", data={**done, "unreachable": sorted(down)},
                   lines=lines)


def archive(using: str | None, verb: str, name: str | None = None, ids: list[str] | None = None) -> Reply:
    """`loom archive list | show NAME | restore NAME [--id ID]...`."""
    from journal import retention as kept

    if verb == "list":
        # Each object marked by whether a committed batch on its shard wrote it: one whose batch rolled back (or
        # whose relaxed commit a crash lost) removed nothing, and restore refuses it. A shard that does not
        # answer: its objects unmarked, the shard named, exit 4 after the others.
        names = kept.list_archives()
        down: dict[str, str] = {}
        committed = kept.committed_archives(names, down)
        data = [{"name": n, "alias": kept.archive_alias(n), "committed": committed[n]} for n in names]

        def mark(name: str) -> str:
            alias = kept.archive_alias(name)
            if committed[name] is None:
                return f"unknown ({alias} could not be read)" if alias in down else f"unknown (no database {alias!r})"
            return "yes" if committed[name] else "no (no journal_removal row names it; restore refuses it)"

        lines = [f"{n}  committed: {mark(n)}" for n in names]
        if down:
            raise _partly_unreachable({"archives": data}, down, lines, "read")
        return Reply(data, lines or ["no archives"])
    try:
        if verb == "show":
            manifest, executions = kept.read_archive(name)
            rows = [{"id": e["id"], "flow": e["header"][0][1], "status": e["header"][0][3],
                     "events": len(e.get("event", []))} for e in executions]
            return Reply({"manifest": manifest, "executions": rows},
                         [f"{name}: {manifest['executions']} execution(s), {manifest['events']} event(s), "
                          f"written {manifest['written_at']} on {manifest['alias']}"]
                         + [f"  {r['id']} {r['flow']} {r['status']} ({r['events']} events)" for r in rows])
        restored = kept.restore(name, ids, using)
    except kept.ArchiveError as exc:
        raise Refused(str(exc), kind="ArchiveError") from None
    return Reply(restored, [f"restored {len(restored)} execution(s)", *restored])
