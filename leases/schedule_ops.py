"""An operator's schedule actions (the schedules admin, the operations page, `loom schedules ...`): run now, pause,
resume, backfill a range.

- run now: one execution of the schedule's flow and input, queued now on its queue, id `sched:<name>:run:<UTC
  instant to the microsecond>` (never a tick's id, so it neither takes nor skips a tick). On a paused queue it is
  enqueued and waits for the queue's resume, like any enqueue (queues/pause.py).
- pause / resume: the row's paused_at; the tick skips a paused schedule (its DUE statement), and a code schedule
  rewritten from code at a worker's start stays paused. On resume the schedule's catch_up policy decides what the
  ticks missed meanwhile start, as after any downtime.
- backfill: every cron tick in [start, end] (at most BACKFILL_MAX) queued with the tick's own id
  (`sched:<name>:<tick>`, schedules.execution_id): a tick already started, by the schedule or by an earlier
  backfill, is not started again (the id is taken), so a second backfill of the range adds nothing. A tick
  older than the flow's retention cutoff (journal.retention.cutoff_for) is not queued and is counted apart: its
  execution may have run and been removed by retention, which frees the id, so "the id is free" no longer means
  "never ran".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.db import router

import queues
from journal import shards
from journal.flows import ExecutionExists
from journal.ids import stored_id_problem
from journal.retention import cutoff_for
from journal.store.base import DatabaseBound
from leases.models import Schedule
from leases.schedules import ID_PREFIX, InvalidSchedule, execution_id, next_tick

BACKFILL_MAX = 1000  # ticks one backfill queues at most: a longer range is refused, nothing queued

# -- pause / resume -- the tick reads paused_at in its DUE statement (leases/store); the update's row lock only.
PAUSE = "UPDATE leases_schedule SET paused_at = %s, paused_by = %s WHERE name = %s AND paused_at IS NULL"
RESUME = "UPDATE leases_schedule SET paused_at = NULL, paused_by = '' WHERE name = %s AND paused_at IS NOT NULL"


class UnknownSchedule(InvalidSchedule):
    """No schedule of that name: nothing was done."""


@dataclass
class Backfill:
    schedule: str
    started: list[str] = field(default_factory=list)  # the execution ids queued now
    already: list[str] = field(default_factory=list)  # ticks whose execution existed: not queued again
    expired: list[str] = field(default_factory=list)  # ticks older than the retention cutoff: not queued
    cutoff: datetime | None = None  # the flow's retention cutoff when the backfill ran (None: kept forever)

    def summary(self) -> str:
        """What the operator is told (the admin's message, the CLI's line)."""
        said = f"schedule {self.schedule}: backfill queued {len(self.started)} tick(s), {len(self.already)} " \
               "already started"
        if self.expired:
            said += (f", {len(self.expired)} tick(s) older than the retention cutoff ({self.cutoff.isoformat()}) "
                     "not queued (they may have run and been removed)")
        return said


def _alias(using: str | None) -> str:
    return using or router.db_for_write(Schedule)


def _row(name: object, using: str | None):
    if stored_id_problem(name) is not None:  # not a str, empty, a NUL (PostgreSQL's DataError), ...: no such row
        raise UnknownSchedule(f"no schedule named {name!r}")
    row = Schedule.objects.using(_alias(using)).filter(name=name).first()
    if row is None:
        raise UnknownSchedule(f"no schedule named {name!r}")
    return row


class _Store(DatabaseBound):
    def now(self):
        from django.utils import timezone

        now = timezone.now()
        if self.connection.vendor == "sqlite":
            from leases.store.sqlite import stamp

            return stamp(now)
        return now


def pause(name: str, by: str = "", using: str | None = None) -> bool:
    """Pause the schedule; False if it already was (who paused it first is kept)."""
    _row(name, using)
    store = _Store(_alias(using))
    return store._count(PAUSE, [store.now(), by[:200], name]) == 1


def resume(name: str, using: str | None = None) -> bool:
    """Resume it; False if it was not paused."""
    _row(name, using)
    return _Store(_alias(using))._count(RESUME, [name]) == 1


def _enqueue(row, eid: str, meta: dict, using: str) -> bool:
    """Queue one execution of the schedule; False if that id exists already (not queued again)."""

    try:
        # created False: this very start, already queued
        return queues.enqueue(row.flow, row.input, queue=row.queue or "default", execution_id=eid, meta=meta,
                              using=None if shards.sharded() else using).created
    except ExecutionExists:  # the id is taken by another start (the schedule's own tick of it, say)
        return False


def run_now(name: str, by: str = "", using: str | None = None) -> str:
    """Queue one execution of the schedule now (paused or not, on a paused queue too: it waits there); its id."""
    row = _row(name, using)
    now = datetime.now(UTC)
    eid = f"{ID_PREFIX}{row.name}:run:{now:%Y-%m-%dT%H:%M:%S.%fZ}"
    meta = {"started_by": f"schedule:{row.name} (run now by {by or 'an operator'})", "schedule": row.name,
            "run_now": now.isoformat()}
    _enqueue(row, eid, meta, _alias(using))
    return eid


def ticks_between(cron: str, start: datetime, end: datetime, tz: str = "UTC") -> list[datetime]:
    """The cron's ticks in [start, end]; InvalidSchedule if more than BACKFILL_MAX or the range is reversed."""
    if start.tzinfo is None or end.tzinfo is None:
        raise InvalidSchedule("backfill: give the range's times with a time zone (or as UTC)")
    if end < start:
        raise InvalidSchedule(f"backfill: the range ends ({end.isoformat()}) before it starts ({start.isoformat()})")
    found: list[datetime] = []
    try:  # a range at the calendar's ends (year 1, 9999) steps out of datetime's range: refused by name
        moment = next_tick(cron, start.replace(microsecond=0) - timedelta(seconds=1), tz)
        while moment <= end:
            if len(found) == BACKFILL_MAX:
                raise InvalidSchedule(f"backfill: more than {BACKFILL_MAX} ticks in the range; give a shorter one")
            found.append(moment)
            moment = next_tick(cron, moment, tz)
    except OverflowError:
        raise InvalidSchedule(f"backfill: the range ({start.isoformat()} to {end.isoformat()}) reaches the end of "
                              "the calendar (year 1 or 9999); give one inside it") from None
    except StopIteration:  # no tick after the last one found within cronsim's horizon: the range has no more
        pass
    return found


def backfill(name: str, start: datetime, end: datetime, by: str = "", using: str | None = None) -> Backfill:
    """Queue each tick of [start, end] once, with the tick's own id (see the module's docstring)."""
    row = _row(name, using)
    ticks = ticks_between(row.cron, start, end, row.timezone)  # refused before anything is queued
    done = Backfill(row.name, cutoff=cutoff_for(row.flow))
    for moment in ticks:
        eid = execution_id(row.name, moment)
        if done.cutoff is not None and moment < done.cutoff:
            done.expired.append(eid)  # its id may be free because retention removed the run: never re-run it
            continue
        meta = {"started_by": f"schedule:{row.name} (backfill by {by or 'an operator'})", "schedule": row.name,
                "tick": moment.isoformat(), "backfill": True}
        (done.started if _enqueue(row, eid, meta, _alias(using)) else done.already).append(eid)
    return done
