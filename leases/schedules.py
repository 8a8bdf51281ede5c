"""Cron schedules of flows: each tick starts exactly one execution, whichever workers tick it.

    from leases.schedules import schedule

    schedule("*/5 * * * *", flow="reports.refresh", input={"full": False}, name="refresh")  # in code
    @schedule("0 9 * * 1-5", timezone="Europe/Paris")  # or on top of a flow: the schedule is named after it
    @flow("nightly.cleanup")
    def cleanup(ctx, input): ...

Why it is exactly once: a tick's execution id is derived from the schedule and the tick
(`sched:<name>:<tick, UTC ISO>`), so two workers that both tried to start it would name the same
execution, and the second start is a no-op (the queued execution's id: every tick is queued, on the
schedule's queue or the default one). They do not even try: `tick()` claims the due schedules under a
row lock (FOR UPDATE SKIP LOCKED on PostgreSQL, the write lock on SQLite), starts their ticks and
moves their next tick in one transaction. The rows, not any process's memory, say what is due.

With LOOM_SHARDS the schedules stay on one database (the router leaves `leases.Schedule` on the default
one: a schedule names no stream); each tick's execution is placed by its id on its shard like any start
(docs/schedules.md).

The cron parser is cronsim (kept, small, no dependencies; croniter was the alternative and is
larger): 5 fields, or 6 with a leading seconds field, evaluated in the schedule's time zone (an IANA
name, zoneinfo; "UTC" by default) with cronsim's daylight-saving rules (those of Debian's cron): a
cron of fixed minute and hour fires once on the day its local time is skipped (at the end of the gap)
or repeated (at its first occurrence); any other follows elapsed time. Ticks are UTC instants all the
same: the zone only decides which instants match. A missed tick (every worker
was down) follows the schedule's catch-up policy: `skip` (run the latest missed tick only if it is at
most LOOM_SCHEDULE_GRACE late), `once` (one execution for all missed ticks: the latest), `all`
(every missed tick, oldest first, LOOM_SCHEDULE_CATCH_UP_MAX per claim). docs/schedules.md.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from functools import cache
from typing import Any
from zoneinfo import ZoneInfo, available_timezones

from cronsim import CronSim, CronSimError
from django.db import DatabaseError, connections, router
from django.utils import timezone as django_timezone

from journal import jsonvalues, shards
from journal.atomic import atomic
from journal.exceptions import InvalidPayload
from journal.flows import ExecutionExists
from journal.flows.errors import FlowError
from journal.flows.registry import Flow, get_flow, registered
from leases import conf
from leases.models import Schedule
from leases.store import store_for
from leases.store.base import ScheduleWrite

log = logging.getLogger("loom.schedules")

CATCH_UP = ("skip", "once", "all")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}\Z")
ID_PREFIX = "sched:"


class InvalidSchedule(FlowError, ValueError):
    """A schedule's definition is refused (malformed cron, bad name, time zone, catch-up policy or queue);
    nothing written."""


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """A validated schedule definition (what `define` writes)."""

    name: str
    cron: str
    flow: str
    input: Any
    catch_up: str = "skip"
    queue: str = ""
    enabled: bool = True
    timezone: str = "UTC"


@dataclass(frozen=True, slots=True)
class Started:
    """One tick started by `tick()` (started_at: this host's clock, for the lateness bench)."""

    schedule: str
    tick: datetime
    execution_id: str
    started_at: datetime


_CODE: dict[str, ScheduleSpec] = {}


# -- definitions ---------------------------------------------------------------------------------------
def parse_cron(expr: object) -> str:
    """The cron expression, normalised (single spaces); InvalidSchedule if cronsim refuses it."""
    if not isinstance(expr, str) or not expr.strip() or len(expr) > 200:
        raise InvalidSchedule(f"a cron expression is a non-empty string of at most 200 characters, not {expr!r}")
    text = " ".join(expr.split())
    if len(text.split()) not in (5, 6):
        raise InvalidSchedule(f"cron {expr!r}: 5 fields (minute hour day month weekday) or 6 with a leading "
                              f"seconds field, not {len(text.split())}")
    if not text.isascii() or not text.isprintable():
        raise InvalidSchedule(f"cron {expr!r}: ASCII fields only (digits, names, * / - , L W #)")
    try:
        next(CronSim(text, datetime(2000, 1, 1, tzinfo=UTC)))  # a cron that never fires is refused too
    except (CronSimError, ValueError, IndexError, KeyError, StopIteration) as exc:
        raise InvalidSchedule(f"cron {expr!r} is malformed: {exc or 'it never fires'}") from None
    return text


def parse_zone(name: object) -> str:
    """The IANA time zone name, as given; InvalidSchedule unless zoneinfo knows it on this host.

    Only the names zoneinfo lists (the system's tz database or the tzdata package) are accepted, as
    written ("Europe/Paris", not "europe/paris"); "localtime" is refused: it is whatever zone the host
    running the worker is set to, and the ticks must not depend on which host claims them."""
    if not isinstance(name, str) or not name or len(name) > 64:
        raise InvalidSchedule(f"time zone {name!r}: an IANA name of at most 64 characters, like Europe/Paris or UTC")
    if name == "localtime" or name not in _zone_names():
        raise InvalidSchedule(f"time zone {name!r} is unknown: an IANA name, like Europe/Paris or UTC "
                              "(zoneinfo.available_timezones())")
    return name


@cache
def _zone_names() -> frozenset[str]:
    """The zone names this process can load (a walk of the tz database: once per process)."""
    return frozenset(available_timezones())


def zone(name: str) -> tzinfo:
    """The tzinfo of a validated zone name: UTC itself for "UTC" (cronsim's plain path, no DST fix-up)."""
    return UTC if name == "UTC" else ZoneInfo(name)


def next_tick(cron: str, after: datetime, tz: str = "UTC") -> datetime:
    """The first tick of `cron` in zone `tz` strictly after `after` (a UTC datetime, whole seconds).

    cronsim walks a fixed-time cron (5 fields, minute and hour not starting with `*`) in naive local
    time; from a moment in a repeated hour's second pass (fall back) it would name the first pass's
    tick, which is before `after`: such ticks are passed over, so the repeated time fires once."""
    after = after.astimezone(UTC)
    for moment in CronSim(cron, after.astimezone(zone(tz))):
        moment = moment.astimezone(UTC)
        if moment > after:
            return moment
    raise StopIteration  # no tick within cronsim's horizon (50 years), as next() on it would say


def latest_tick(cron: str, at: datetime, tz: str = "UTC") -> datetime:
    """The last tick of `cron` in zone `tz` at or before `at` (a UTC datetime, whole seconds).

    The reverse walk may land a day early from a repeated hour's second pass (the same naive-time
    walk as next_tick): the forward ticks after it that are still at or before `at` are taken too."""
    floor = at.astimezone(UTC).replace(microsecond=0)
    latest = next(CronSim(cron, (floor + timedelta(seconds=1)).astimezone(zone(tz)), reverse=True)).astimezone(UTC)
    while (following := next_tick(cron, latest, tz)) <= floor:
        latest = following
    return latest


def execution_id(name: str, tick: datetime) -> str:
    """The id of the execution a tick starts: the same in every worker (journal/ids.py alphabet)."""
    return f"{ID_PREFIX}{name}:{tick.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"


def validate(name: object, cron: object, flow: str | Flow, input: Any = None, catch_up: object = "skip",
             queue: object = "", enabled: bool = True, timezone: object = "UTC") -> ScheduleSpec:
    """A ScheduleSpec, or our error (InvalidSchedule, UnknownFlow, InvalidInput) before anything is written."""
    if not isinstance(name, str) or not NAME.match(name):
        raise InvalidSchedule(f"schedule name {name!r}: 1 to 100 letters, digits, '-', '_' or '.', "
                              "starting with a letter or digit")
    text = parse_cron(cron)
    zone_name = parse_zone(timezone)
    if catch_up not in CATCH_UP:
        raise InvalidSchedule(f"schedule {name}: catch_up is one of {', '.join(CATCH_UP)}, not {catch_up!r}")
    if not isinstance(queue, str) or len(queue) > 100:
        raise InvalidSchedule(f"schedule {name}: queue is a name of at most 100 characters, not {queue!r}")
    _check_queue(name, queue or "default")  # without a queue: the default queue (always declared)
    definition = get_flow(flow)  # UnknownFlow
    value = {} if input is None else input
    _, stored = definition.prepare(value)  # InvalidInput (the flow's model, the journal's JSON rules)
    return ScheduleSpec(name, text, definition.name, stored, catch_up, queue, bool(enabled), zone_name)


def _check_queue(name: str, queue: str) -> None:
    from django.apps import apps

    if not apps.is_installed("queues"):
        raise InvalidSchedule(f"schedule {name}: queue {queue!r} needs the queues app in INSTALLED_APPS")
    # the queues app is optional (leases runs without it): its modules load only here, once it is known installed
    from queues.declarations import declared  # app registry (optional app)
    from queues.models import Queue  # app registry (optional app)

    if queue not in declared() and not Queue.objects.filter(pk=queue).exists():
        raise InvalidSchedule(f"schedule {name}: no queue {queue!r} is declared (LOOM_QUEUES or declare_queue)")


def define(name: object, cron: object, flow: str | Flow, input: Any = None, catch_up: object = "skip",
           queue: object = "", enabled: bool = True, timezone: object = "UTC", *, source: str = "admin",
           using: str | None = None, now: datetime | None = None) -> ScheduleSpec:
    """Validate and write a schedule (insert or update by name). Its first tick is the first after
    `now`; an update keeps the row's next tick unless the cron or the time zone changed (leases.store
    save_schedule)."""

    spec = validate(name, cron, flow, input, catch_up, queue, enabled, timezone)
    text = jsonvalues.dumps(spec.input, f"input of schedule {spec.name}")
    alias = using or router.db_for_write(Schedule)
    first = next_tick(spec.cron, now or django_timezone.now(), spec.timezone)
    store_for(alias).save_schedule(ScheduleWrite(spec.name, spec.cron, spec.flow, text, spec.catch_up, spec.queue,
                                                 spec.enabled, source, first, spec.timezone))
    return spec


def schedule(cron: str, flow: str | Flow | None = None, *, name: str | None = None, input: Any = None,
             catch_up: str = "skip", queue: str = "", timezone: str = "UTC"):
    """Declare a schedule in code: `schedule(cron, flow="x")`, or `@schedule(cron)` on top of a `@flow`;
    `timezone="Europe/Paris"` evaluates the cron in that zone (an IANA name; UTC by default).

    Checked now (InvalidSchedule; the flow must be registered by the time the decorator runs), kept in
    this process's registry and written to the database by every loom_worker when it starts
    (`sync_code_schedules`): the rows are what the ticks read."""
    parse_cron(cron)
    parse_zone(timezone)
    if catch_up not in CATCH_UP:
        raise InvalidSchedule(f"catch_up is one of {', '.join(CATCH_UP)}, not {catch_up!r}")

    def register(target: str | Flow) -> str | Flow:
        definition = get_flow(target)
        spec = validate(name or _default_name(definition.name), cron, definition, input, catch_up, queue,
                        timezone=timezone)
        _CODE[spec.name] = spec
        return target

    if flow is not None:
        register(flow)
        return lambda target: target
    return register


def _default_name(flow_name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "-", flow_name)[:100].lstrip("-_.") or "schedule"


def code_schedules() -> dict[str, ScheduleSpec]:
    return dict(_CODE)


def forget_code_schedule(name: str) -> None:
    """Drop a code schedule from this process's registry (tests; the row stays until deleted)."""
    _CODE.pop(name, None)


def _schedules_alias() -> str:
    """The one database of the schedules: the routers' choice for leases.Schedule (with LOOM_SHARDS the
    default database: the shard router leaves it there)."""

    return router.db_for_write(Schedule)


def sync_code_schedules(using: str | None = None) -> int:
    """Write every code schedule of this process to the database (a worker does it at start)."""
    using = using or _schedules_alias()
    for spec in _CODE.values():
        define(spec.name, spec.cron, spec.flow, spec.input, spec.catch_up, spec.queue, spec.enabled, spec.timezone,
               source="code", using=using)
    return len(_CODE)


# -- ticking -------------------------------------------------------------------------------------------
def plan(cron: str, due: datetime, now: datetime, catch_up: str, grace: float, limit: int, tz: str = "UTC"
         ) -> tuple[list[datetime], datetime, int]:
    """(ticks to start, oldest first; the schedule's next tick; ticks skipped) for a schedule whose
    next tick `due` is at or before `now`, its cron evaluated in zone `tz`. Pure: the catch-up policies
    in one place. Every instant is UTC, so a daylight-saving change in the missed span is only a
    different distance between two ticks (next_tick and latest_tick apply the DST rules)."""
    if catch_up == "all":
        ticks, moment = [], due
        while moment <= now and len(ticks) < limit:
            ticks.append(moment)
            moment = next_tick(cron, moment, tz)
        return ticks, moment, 0  # moment may still be due: the next claim goes on from there
    latest = max(latest_tick(cron, now, tz), due)
    upcoming = next_tick(cron, now, tz)
    if catch_up == "skip" and (now - latest).total_seconds() > grace:
        return [], upcoming, 1
    return [latest], upcoming, 0


def tick(using: str | None = None, *, limit: int | None = None, flows: Sequence[str] | None = None
         ) -> list[Started]:
    """Start the due ticks of the due schedules (at most `limit` schedules) in one transaction; what
    was started. Only schedules of flows registered in this process are claimed (None: those)."""

    using = using or _schedules_alias()
    store = store_for(using)
    limit = limit or conf.get("LOOM_SCHEDULE_BATCH")
    grace, most = conf.get("LOOM_SCHEDULE_GRACE"), conf.get("LOOM_SCHEDULE_CATCH_UP_MAX")
    started: list[Started] = []
    if not _anything_due(using):  # most ticks: no transaction at all (on SQLite, no write lock taken)
        return started
    with atomic(using):
        now, due = store.claim_due_schedules(limit, sorted(registered()) if flows is None else flows)
        for row in due:
            try:
                ticks, upcoming, skipped = plan(row.cron, row.next_tick_at, now, row.catch_up, grace, most,
                                                row.timezone)
            except (CronSimError, ValueError, LookupError) as exc:
                # A row written around validation, or a zone this host's tz database lacks
                # (ZoneInfoNotFoundError is a LookupError): leave it for a worker that can, say so.
                log.error("schedule %s: cron %r in time zone %r cannot be evaluated: %s", row.name, row.cron,
                          row.timezone, exc)
                continue
            if skipped:
                log.warning("schedule %s: skipped the ticks missed since %s (catch_up=skip, later than %.0f s)",
                            row.name, row.next_tick_at.isoformat(), grace)
            last = eid = None
            for moment in ticks:
                eid = execution_id(row.name, moment)
                if _start(row, eid, moment, using):
                    last = moment
                    started.append(Started(row.name, moment, eid, datetime.now(UTC)))
            store.advance_schedule(row.name, upcoming, last, eid if last is not None else None)
    for one in started:  # after the commit: a logged start is a committed one
        log.info("schedule %s: started execution=%s tick=%s", one.schedule, one.execution_id, one.tick.isoformat())
    return started


def _refusals() -> tuple[type[Exception], ...]:
    """Our errors a start may raise: the journal's, and the queues app's when it is installed."""
    from django.apps import apps

    if apps.is_installed("queues"):
        from queues.exceptions import QueueError

        return (FlowError, InvalidPayload, QueueError)
    return (FlowError, InvalidPayload)


def _anything_due(using: str) -> bool:
    """A plain read before the claim's transaction: is any enabled schedule due by this host's clock
    (give or take a second: the claim itself compares with the database's clock)?"""

    soon = django_timezone.now() + timedelta(seconds=1)
    return Schedule.objects.using(using).filter(enabled=True, paused_at__isnull=True, next_tick_at__lte=soon).exists()


def _start(row, eid: str, moment: datetime, using: str) -> bool:
    """Queue the tick's execution (in a savepoint: a refused start does not undo the other ticks)."""

    meta = {"started_by": f"schedule:{row.name}", "schedule": row.name, "tick": moment.isoformat()}
    try:
        with atomic(using):
            from queues import enqueue

            # Every tick is a queued execution, on the schedule's queue or the default one (caps apply, any
            # loom_worker's dispatcher runs it, --no-cluster too). With LOOM_SHARDS the entry goes to the
            # tick's execution's shard, in its own transaction there: a claim rolled back after it committed
            # re-enqueues the same id, a no-op (exactly once by the id, as between workers).
            enqueue(row.flow, row.input, queue=row.queue or "default", execution_id=eid, meta=meta,
                    using=None if shards.sharded() else using)
    except ExecutionExists as exists:  # the tick's id is taken already: that start is this tick's
        log.info("schedule %s: tick %s already started (%s)", row.name, moment.isoformat(), exists.status)
        return True
    except _refusals() as exc:  # the code changed under the row (input, queue): say so, go on
        log.error("schedule %s: tick %s not started: %s: %s", row.name, moment.isoformat(), type(exc).__name__, exc)
        return False
    return True


def input_text(value: Any) -> str:
    """The admin's and CLI's view of a schedule input."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


class ScheduleService:
    """The worker service: writes this process's code schedules, then ticks every LOOM_SCHEDULE_EVERY."""

    name = "schedules"

    def __init__(self, using: str | None = None) -> None:
        self.using = using or router.db_for_write(Schedule)
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self, worker) -> None:
        try:
            sync_code_schedules(self.using)
        except (DatabaseError, FlowError) as exc:
            log.error("schedules: could not write the code schedules: %s", exc)
        self.thread = threading.Thread(target=self._loop, name="loom-schedules", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        try:
            while not self.stopping.wait(conf.get("LOOM_SCHEDULE_EVERY")):
                try:
                    tick(self.using)
                except DatabaseError:
                    log.exception("schedule tick failed; retrying")
                    connections.close_all()
                except Exception:  # the service outlives any one tick (it rolled back: the rows say what is due)
                    log.exception("schedule tick failed; retrying")
        finally:
            connections.close_all()

    def quiesce(self) -> None:
        self.stopping.set()  # no new tick (a graceful shutdown)

    def stop(self, timeout: float) -> None:
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(timeout)


__all__ = ["InvalidSchedule", "ScheduleService", "ScheduleSpec", "Started", "define", "execution_id", "latest_tick",
           "next_tick", "parse_zone", "plan", "schedule", "sync_code_schedules", "tick", "validate"]
