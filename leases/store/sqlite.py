"""Leases on SQLite: the same statements as PostgreSQL, serialised by SQLite's single writer.

SQLite is a single-host store, so times come from this host's clock (one clock for every process
sharing the file), written in the text format Django uses, which compares correctly as text.
Lists travel as one JSON array through json_each, so each statement's text is the same for any
batch size (the sqlite3 module caches it). No row locks are needed: every write statement, and
the takeover transaction (BEGIN IMMEDIATE), holds the database's write lock while it checks and
writes, so no renewal or acquire can slip in between a check and its write.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from django.utils.dateparse import parse_datetime

from journal.atomic import atomic
from journal.store import sqlite as journal_sql
from journal.store import store_for as journal_store
from journal.store.base import flow_keys
from leases.store import base
from leases.store.base import DueSchedule, Item, LeaseStore, Reservation, Takeover, split_stuck

PAIRS = "SELECT json_extract(value, '$[0]') AS eid, json_extract(value, '$[1]') AS tok FROM json_each(%(items)s)"
IDS = "SELECT value FROM json_each(%(eids)s)"

# -- acquire --
# See leases/store/postgres.py ACQUIRE: a lease only at the current fence token; on conflict it
# moves to a higher token or is refreshed by the same owner at the same token. (WHERE true is
# SQLite's documented way to keep INSERT ... SELECT ... ON CONFLICT unambiguous.) %(handed_back)s: see
# postgres.ACQUIRE (a graceful hand-back of rowless lazy claims; every write sets the mark anew).
ACQUIRE = f"""
INSERT INTO leases_lease (execution_id, owner, fence_token, acquired_at, renewed_at, expires_at, handed_back)
SELECT t.eid, %(owner)s, t.tok, %(now)s, %(now)s, %(expires)s, %(handed_back)s FROM ({PAIRS}) t
{journal_sql.CURRENT_FENCE_JOIN.format(eid="t.eid", token="t.tok")}
WHERE true
ON CONFLICT (execution_id) DO UPDATE SET owner = excluded.owner, fence_token = excluded.fence_token,
    acquired_at = excluded.acquired_at, renewed_at = excluded.renewed_at, expires_at = excluded.expires_at,
    handed_back = excluded.handed_back
WHERE leases_lease.fence_token < excluded.fence_token
   OR (leases_lease.fence_token = excluded.fence_token AND leases_lease.owner = excluded.owner)
RETURNING execution_id
"""

# -- renew_many --
# One statement per chunk per tick; rows taken over (other owner or token) are not returned.
# Only while the fence is still the lease's (see postgres.RENEW_MANY: a cancel ends the renewals); a renewed
# lease is no hand-back.
RENEW_MANY = f"""
UPDATE leases_lease SET renewed_at = %(now)s, expires_at = %(expires)s, handed_back = 0
WHERE owner = %(owner)s AND (execution_id, fence_token) IN ({PAIRS})
  AND EXISTS (SELECT 1 FROM leases_lease cur {journal_sql.CURRENT_FENCE_JOIN.format(eid="cur.execution_id",
                                                                                   token="cur.fence_token")}
              WHERE cur.execution_id = leases_lease.execution_id)
RETURNING execution_id
"""

# -- release --
RELEASE = f"DELETE FROM leases_lease WHERE owner = %(owner)s AND (execution_id, fence_token) IN ({PAIRS})"

# -- expire -- (%(graceful)s: marked handed back, see postgres.EXPIRE)
EXPIRE = f"""
UPDATE leases_lease SET expires_at = %(now)s, handed_back = %(graceful)s
WHERE owner = %(owner)s AND (execution_id, fence_token) IN ({PAIRS})
"""

# -- takeover: candidates --
# See leases/store/postgres.py: expired lease (by the expires_at index), or none for longer than
# `orphan_after` (the journal's RECOVERY_CANDIDATES hook with our two terms, in one statement); the
# orphans only among headers stamped since %(since)s ('' for the full orphan pass).
TAKEOVER_CANDIDATES = journal_sql.RECOVERY_CANDIDATES.format(
    expired="SELECT l.execution_id FROM leases_lease l WHERE l.expires_at < %(now)s",
    unleased="NOT EXISTS (SELECT 1 FROM leases_lease l WHERE l.execution_id = o.id)",
)

# -- takeover: claim -- (see postgres.TAKEOVER_CLAIM: handed_back is kept and returned, cleared by TAKEOVER_TOKEN;
# the stuck candidates are claimed too, under the write lock.)
TAKEOVER_CLAIM = f"""
INSERT INTO leases_lease (execution_id, owner, fence_token, acquired_at, renewed_at, expires_at, handed_back)
SELECT t.value, %(owner)s, 0, %(now)s, %(now)s, %(expires)s, 0 FROM ({IDS}) t
WHERE true
ON CONFLICT (execution_id) DO UPDATE SET owner = excluded.owner, fence_token = 0,
    acquired_at = excluded.acquired_at, renewed_at = excluded.renewed_at, expires_at = excluded.expires_at
WHERE leases_lease.expires_at < %(now)s
RETURNING execution_id, handed_back
"""

# -- takeover: fence -- the journal's advance_fences, in the same transaction (see postgres.py).

# -- takeover: token --
TAKEOVER_TOKEN = f"""
UPDATE leases_lease SET fence_token = (SELECT t.tok FROM ({PAIRS}) t WHERE t.eid = leases_lease.execution_id),
    handed_back = 0
WHERE execution_id IN (SELECT json_extract(value, '$[0]') FROM json_each(%(items)s))
"""

# -- takeover: give up -- the journal's mark_stuck, advance_fences (see postgres.py: the count is count_recovery's).
GIVE_UP_LEASE = f"DELETE FROM leases_lease WHERE execution_id IN ({IDS})"

# -- worker --
TOUCH_WORKER = """
INSERT INTO leases_worker (id, host, pid, role, started_at, seen_at, stopped_at) VALUES (%s, %s, %s, %s, %s, %s, NULL)
ON CONFLICT (id) DO UPDATE SET seen_at = excluded.seen_at, stopped_at = NULL, host = excluded.host, pid = excluded.pid,
    role = excluded.role
"""
STOP_WORKER = "UPDATE leases_worker SET stopped_at = %s, seen_at = %s WHERE id = %s"

# -- worker: prune --
# See leases/store/postgres.py PRUNE_WORKERS.
PRUNE_WORKERS = """
DELETE FROM leases_worker
WHERE seen_at < %(cutoff)s AND NOT EXISTS (SELECT 1 FROM leases_lease l WHERE l.owner = leases_worker.id)
"""

# -- prune_settled_leases -- (leases/store/base.py: this host's clock, Django's text form)
PRUNE_SETTLED_LEASES = base.PRUNE_SETTLED_LEASES.format(now="%s")


def stamp(moment: datetime) -> str:
    """Django's SQLite text form of an aware UTC datetime (always with microseconds)."""
    return moment.astimezone(UTC).replace(tzinfo=None).strftime("%Y-%m-%d %H:%M:%S.%f")


def _now() -> datetime:
    return datetime.now(UTC)


def _pairs(items: Sequence[Item]) -> str:
    return json.dumps([[eid, tok] for eid, tok in items])


# == schedules (leases/schedules.py) ===================================================================
# See leases/store/postgres.py for what each statement does. No row locks: the tick's transaction
# began IMMEDIATE (the database's write lock), so a second ticker's claim waits for the first one's
# commit and then finds the advanced, no longer due, next tick.

# -- schedule: save --
SAVE_SCHEDULE = """
INSERT INTO leases_schedule (name, cron, timezone, flow, input, catch_up, queue, enabled, source, next_tick_at,
                             last_tick_at, last_execution_id, created_at, updated_at)
VALUES (%(name)s, %(cron)s, %(timezone)s, %(flow)s, %(input)s, %(catch_up)s, %(queue)s, %(enabled)s, %(source)s,
        %(next)s, NULL, '', %(now)s, %(now)s)
ON CONFLICT (name) DO UPDATE SET cron = excluded.cron, timezone = excluded.timezone, flow = excluded.flow,
    input = excluded.input, catch_up = excluded.catch_up, queue = excluded.queue, enabled = excluded.enabled,
    source = excluded.source,
    next_tick_at = CASE WHEN leases_schedule.cron = excluded.cron AND leases_schedule.timezone = excluded.timezone
                             AND (leases_schedule.enabled OR NOT excluded.enabled)
                        THEN leases_schedule.next_tick_at ELSE excluded.next_tick_at END,
    updated_at = excluded.updated_at
"""

# -- schedule: claim due -- (under the write lock of the caller's transaction)
CLAIM_DUE_SCHEDULES = """
SELECT name, cron, flow, input, catch_up, queue, next_tick_at, timezone FROM leases_schedule
WHERE enabled AND paused_at IS NULL AND next_tick_at <= %(now)s
  AND (%(any_flow)s OR flow IN (SELECT value FROM json_each(%(flows)s)))
ORDER BY next_tick_at, name
LIMIT %(limit)s
"""

# -- schedule: advance --
ADVANCE_SCHEDULE = """
UPDATE leases_schedule SET next_tick_at = %(next)s, last_tick_at = COALESCE(%(last)s, last_tick_at),
    last_execution_id = COALESCE(%(eid)s, last_execution_id), updated_at = %(now)s
WHERE name = %(name)s
"""


def _moment(value) -> datetime:
    """A datetime column read back through a raw cursor: Django's UTC text, or already a datetime."""
    moment = datetime.fromisoformat(value) if isinstance(value, str) else value
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


class SqliteSchedules:
    """The schedule statements of SqliteLeaseStore (mixed in below)."""

    def save_schedule(self, row):
        self._count(SAVE_SCHEDULE, {"name": row.name, "cron": row.cron, "timezone": row.timezone, "flow": row.flow,
                                    "input": row.input,
                                    "catch_up": row.catch_up, "queue": row.queue, "enabled": row.enabled,
                                    "source": row.source, "next": stamp(row.next_tick_at), "now": stamp(_now())})

    def claim_due_schedules(self, limit, flows=None):
        now = _now()
        rows = self._rows(CLAIM_DUE_SCHEDULES, {"now": stamp(now), "limit": limit, "any_flow": flows is None,
                                                "flows": json.dumps(list(flows or []))})
        return now, [DueSchedule(name, cron, flow, json.loads(data) if isinstance(data, str) else data, catch_up,
                                 queue, _moment(due), zone)
                     for name, cron, flow, data, catch_up, queue, due, zone in rows]

    def advance_schedule(self, name, next_tick_at, last_tick_at, last_execution_id):
        self._count(ADVANCE_SCHEDULE, {"name": name, "next": stamp(next_tick_at), "now": stamp(_now()),
                                       "last": None if last_tick_at is None else stamp(last_tick_at),
                                       "eid": last_execution_id})


# -- prune_reservations --
# The reservations whose execution began (leases/store/base.py PRUNE_RESERVATIONS), with this backend's
# journal hook for "the execution has a header": one statement, no lock (a header is never deleted).
PRUNE_RESERVATIONS = base.PRUNE_RESERVATIONS.format(
    begun=journal_sql.EXECUTION_EXISTS.format(eid="leases_startreservation.execution_id"))


class SqliteLeaseStore(SqliteSchedules, LeaseStore):
    prune_reservations_sql = PRUNE_RESERVATIONS

    def _reservation(self, row: tuple) -> Reservation:
        # created_at is the column default's text (UTC): the same aware datetime the ORM reads.
        created = parse_datetime(row[4]) if isinstance(row[4], str) else row[4]
        if created is not None and created.tzinfo is None:
            created = created.replace(tzinfo=UTC)
        return Reservation(*row[:4], created)

    vendor = "sqlite"

    @staticmethod
    def _times(ttl: float) -> dict:
        now = _now()
        return {"now": stamp(now), "expires": stamp(now + timedelta(seconds=ttl))}

    def acquire_many(self, owner, items, ttl, release=(), handed_back=False):
        if not items:
            if release:
                self.release_many(owner, release)
            return set()
        params = {"owner": owner, "items": _pairs(items), "handed_back": handed_back, **self._times(ttl)}
        if release:
            # The releases riding along commit with the acquires: one write transaction.
            with atomic(self.alias):
                self._count(RELEASE, {"owner": owner, "items": _pairs(release)})
                rows = self._rows(ACQUIRE, params)
        else:
            rows = self._rows(ACQUIRE, params)
        return {r[0] for r in rows}

    def renew_many(self, owner, items, ttl):
        if not items:
            return set()
        rows = self._rows(RENEW_MANY, {"owner": owner, "items": _pairs(items), **self._times(ttl)})
        return {r[0] for r in rows}

    def release_many(self, owner, items):
        if not items:
            return 0
        return self._count(RELEASE, {"owner": owner, "items": _pairs(items)})

    def expire_many(self, owner, items, graceful=False):
        if not items:
            return 0
        return self._count(EXPIRE, {"owner": owner, "items": _pairs(items), "now": stamp(_now()),
                                    "graceful": graceful})

    def takeover(self, owner, ttl, orphan_after, max_attempts, limit, flows=None, orphan_window=None):
        # BEGIN IMMEDIATE: the whole check-and-take runs under the write lock.
        with atomic(self.alias):
            now = _now()
            times = self._times(ttl)
            since = "" if orphan_window is None else stamp(now - timedelta(seconds=orphan_after + orphan_window))
            candidates = self._rows(TAKEOVER_CANDIDATES, {
                "now": times["now"], "orphan": stamp(now - timedelta(seconds=orphan_after)), "since": since,
                "limit": limit, "any_flow": flows is None,
                "flows": json.dumps([list(key) for key in zip(*flow_keys(flows or []), strict=True)])})
            if not candidates:
                return Takeover()
            claimed = {eid: bool(back) for eid, back in self._rows(TAKEOVER_CLAIM, {
                "owner": owner, "eids": json.dumps([eid for eid, _, _ in candidates]), **times})}
            stuck, retry = split_stuck(candidates, claimed, max_attempts)
            journal = journal_store(self.alias)
            if stuck:
                journal.mark_stuck(stuck)
                journal.advance_fences(stuck)
                self._count(GIVE_UP_LEASE, {"eids": json.dumps(stuck)})
            taken: list[Item] = []
            if retry:
                taken = journal.advance_fences(retry)
                self._count(TAKEOVER_TOKEN, {"items": _pairs(taken)})
                unfenced = set(retry) - {t[0] for t in taken}
                if unfenced:
                    self._count(GIVE_UP_LEASE, {"eids": json.dumps(sorted(unfenced))})
            return Takeover(sorted(taken), sorted(stuck), {eid: flow for eid, _, flow in candidates},
                            handed_back=sorted(eid for eid, _ in taken if claimed[eid]))

    def touch_worker(self, worker_id, host, pid, role=""):
        now = stamp(_now())
        with self.connection.cursor() as cursor:
            cursor.execute(TOUCH_WORKER, [worker_id, host, pid, role, now, now])

    def prune_workers(self, older_than):
        return self._count(PRUNE_WORKERS, {"cutoff": stamp(_now() - timedelta(seconds=older_than))})

    def prune_settled_leases(self):
        return self._count(PRUNE_SETTLED_LEASES, [stamp(_now())])

    def stop_worker(self, worker_id):
        now = stamp(_now())
        with self.connection.cursor() as cursor:
            cursor.execute(STOP_WORKER, [now, now, worker_id])
