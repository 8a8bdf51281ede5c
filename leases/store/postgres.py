"""Leases on PostgreSQL: every statement, named, with the reason for each lock and ordering rule.

Times come from the database clock (now()), never from the worker's: several hosts share the
table and their clocks may disagree; the expiry a sweeper compares against is the one the owner
wrote with the same clock. Lists travel as arrays through unnest, so each statement's text is the
same for any batch size and psycopg prepares it once per connection.

Lock order: every statement that locks several lease rows locks them in execution_id order
(ORDER BY ... FOR UPDATE, or an ordered INSERT), so a renewal, a release and a sweeper's takeover
touching the same rows wait for each other instead of deadlocking.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Sequence

from journal.atomic import atomic
from journal.flows.ownership import Companion
from journal.store import postgres as journal_sql
from journal.store import store_for as journal_store
from journal.store.base import EXECUTION_STATUS_OF, flow_keys
from leases.store import base
from leases.store.base import DueSchedule, Item, LeaseStore, Takeover, split_stuck

# -- acquire --
# Group-committed acquire of many leases. A row is written only when the token is the execution's
# current fence (a run whose fence was already advanced never gets a lease: the journal's
# CURRENT_FENCE_JOIN hook, in this very statement). On conflict the lease
# moves only to a HIGHER token (a resume or takeover supersedes the old owner, whose renewal then
# fails) or is refreshed by the same owner at the same token; a lower token is refused. ON CONFLICT
# waits for a racing takeover's uncommitted row and re-checks the WHERE against its committed
# token, so a late lazy acquire of a taken-over run is refused. %(handed_back)s is false but for a graceful
# hand-back of lazy claims that had no row yet (TTL 0: written expired, leases/keeper.py flush_handbacks); every
# write of the row sets the mark anew, so a lease moved or refreshed since a hand-back is no hand-back.
ACQUIRE = f"""
INSERT INTO leases_lease AS l (execution_id, owner, fence_token, acquired_at, renewed_at, expires_at, handed_back)
SELECT t.eid, %(owner)s, t.tok, now(), now(), now() + %(ttl)s::float8 * interval '1 second', %(handed_back)s
FROM unnest(%(eids)s::text[], %(tokens)s::bigint[]) AS t(eid, tok)
{journal_sql.CURRENT_FENCE_JOIN.format(eid="t.eid", token="t.tok")}
ORDER BY t.eid
ON CONFLICT (execution_id) DO UPDATE SET owner = EXCLUDED.owner, fence_token = EXCLUDED.fence_token,
    acquired_at = EXCLUDED.acquired_at, renewed_at = EXCLUDED.renewed_at, expires_at = EXCLUDED.expires_at,
    handed_back = EXCLUDED.handed_back
WHERE l.fence_token < EXCLUDED.fence_token
   OR (l.fence_token = EXCLUDED.fence_token AND l.owner = EXCLUDED.owner)
RETURNING l.execution_id
"""

# -- acquire_releasing --
# ACQUIRE with the releases of settled runs riding along in the same statement (group commit of
# both: one round trip and one commit instead of two). The release set never names an execution
# of the acquire set (the keeper drops those: the higher token supersedes), so no row is touched
# twice by one statement.
ACQUIRE_RELEASING = """
WITH released AS (
    DELETE FROM leases_lease WHERE execution_id IN (
        SELECT r.execution_id FROM leases_lease r
        JOIN unnest(%(rel_eids)s::text[], %(rel_tokens)s::bigint[]) AS x(eid, tok)
          ON r.execution_id = x.eid AND r.fence_token = x.tok
        WHERE r.owner = %(owner)s
        ORDER BY r.execution_id
        FOR UPDATE OF r
    ) RETURNING execution_id
)""" + ACQUIRE

# -- renew_many --
# One statement per chunk per tick. Only rows still held by this owner at the run's token are
# extended: a lease that was taken over (new owner, higher token) is simply not returned, which is
# how the former owner learns it lost. An expired lease nobody took yet is renewed: its owner
# still holds the current fence, so nothing was lost.
# Only while the fence is still the lease's: a cancel (or any takeover) that moved the fence ends the renewals,
# so the run learns of it at the next tick and its running step is told (journal/flows/interrupt.py).
# A renewed lease is held by a live owner: no hand-back (the mark is cleared).
RENEW_MANY = f"""
WITH mine AS (
    SELECT l.execution_id FROM leases_lease l
    JOIN unnest(%(eids)s::text[], %(tokens)s::bigint[]) AS t(eid, tok)
      ON l.execution_id = t.eid AND l.fence_token = t.tok
    {journal_sql.CURRENT_FENCE_JOIN.format(eid="l.execution_id", token="l.fence_token")}
    WHERE l.owner = %(owner)s
    ORDER BY l.execution_id
    FOR UPDATE OF l
)
UPDATE leases_lease l SET renewed_at = now(), expires_at = now() + %(ttl)s::float8 * interval '1 second',
    handed_back = false
FROM mine WHERE l.execution_id = mine.execution_id
RETURNING l.execution_id
"""

# -- release --
# Group-committed release of settled runs: delete only what this owner holds at these tokens
# (a lease taken over meanwhile belongs to someone else now).
RELEASE = """
DELETE FROM leases_lease WHERE execution_id IN (
    SELECT l.execution_id FROM leases_lease l
    JOIN unnest(%(eids)s::text[], %(tokens)s::bigint[]) AS t(eid, tok)
      ON l.execution_id = t.eid AND l.fence_token = t.tok
    WHERE l.owner = %(owner)s
    ORDER BY l.execution_id
    FOR UPDATE OF l
)
"""

# -- expire --
# Clean shutdown: the runs are unfinished, so keep the row but make it expired now; the next
# recovery sweep of any worker takes it over without waiting for the TTL. %(graceful)s marks the row handed
# back (handed_back): the run stopped at a step boundary for a graceful shutdown, so the takeover that follows is
# no recovery attempt (TAKEOVER_CLAIM reports it); false for a run cut off mid-step (a step whose heartbeat timed
# out, one still running when the shutdown's grace ended): its takeover counts, as after a crash.
EXPIRE = """
UPDATE leases_lease l SET expires_at = now(), handed_back = %(graceful)s FROM (
    SELECT l2.execution_id FROM leases_lease l2
    JOIN unnest(%(eids)s::text[], %(tokens)s::bigint[]) AS t(eid, tok)
      ON l2.execution_id = t.eid AND l2.fence_token = t.tok
    WHERE l2.owner = %(owner)s
    ORDER BY l2.execution_id
    FOR UPDATE OF l2
) mine WHERE l.execution_id = mine.execution_id
"""

# -- takeover: candidates --
# Running executions whose lease expired, or that have none although they were last updated more
# than `orphan_after` ago (a lazy run takes its lease after the grace, so an older one without a
# lease is orphaned: its process died within the grace). The journal's RECOVERY_CANDIDATES hook
# (its executions, FOR UPDATE OF e SKIP LOCKED: two sweepers never take the same execution, and
# neither waits for the other) with our two terms, in one statement: the expired arm reads only the
# lapsed range of the expires_at index (no lock on the lease: TAKEOVER_CLAIM re-checks the expiry
# under its row lock, and a renewal that committed first wins there), and the orphan arm probes the
# primary key for each old running execution the journal's partial index yields: those that passed
# the grace within %(window)s seconds (the common sweep), or all of them when it is NULL (the full
# orphan pass; leases/recovery.py OrphanReach decides which).
TAKEOVER_CANDIDATES = journal_sql.RECOVERY_CANDIDATES.format(
    expired="SELECT l.execution_id FROM leases_lease l WHERE l.expires_at < now()",
    unleased="NOT EXISTS (SELECT 1 FROM leases_lease l WHERE l.execution_id = o.id)",
)

# -- takeover: claim --
# Move the leases to the sweeper, but only if still expired (or still missing): the WHERE is
# re-checked after waiting for a concurrent renewal or lazy acquire, which then wins. The token is
# a placeholder until the fence is advanced below, in the same transaction (nobody sees it).
# handed_back is left as it was (RETURNING reads it under the row lock, re-checked like the expiry): whether the
# former owner handed the lease back at a step boundary (no recovery attempt) or it lapsed (a crash, a cut-off
# step) or there was none (an orphan); TAKEOVER_TOKEN clears it. The stuck candidates are claimed too (their
# lease then dropped): a candidate whose lease was renewed since the candidates' snapshot is neither.
TAKEOVER_CLAIM = """
INSERT INTO leases_lease AS l (execution_id, owner, fence_token, acquired_at, renewed_at, expires_at, handed_back)
SELECT t.eid, %(owner)s, 0, now(), now(), now() + %(ttl)s::float8 * interval '1 second', false
FROM unnest(%(eids)s::text[]) AS t(eid)
ORDER BY t.eid
ON CONFLICT (execution_id) DO UPDATE SET owner = EXCLUDED.owner, fence_token = 0,
    acquired_at = EXCLUDED.acquired_at, renewed_at = EXCLUDED.renewed_at, expires_at = EXCLUDED.expires_at
WHERE l.expires_at < now()
RETURNING l.execution_id, l.handed_back
"""

# -- takeover: fence --
# The claimed executions' fences advance in the same transaction (the journal's advance_fences: FOR
# UPDATE in stream order waits for the former owner's in-flight fenced append; from this commit on
# its token is refused).

# -- takeover: token --
# (Under the claim's row locks, same transaction; the hand-back mark goes: the sweeper holds the lease now.)
TAKEOVER_TOKEN = """
UPDATE leases_lease l SET fence_token = t.tok, handed_back = false
FROM unnest(%(eids)s::text[], %(tokens)s::bigint[]) AS t(eid, tok) WHERE l.execution_id = t.eid
"""

# -- takeover: count / give up --
# The recovery is counted on the header once the resumed run reached the database (the journal's count_recovery,
# leases/recovery.py resume_one), not here: a takeover whose run could not connect (a connection spike) is no
# attempt of the flow (#35), nor one of a lease handed back at a step boundary (Takeover.handed_back: resume_one
# does not count it, and it is never marked stuck for its past recoveries). Too many recoveries: the journal
# marks it stuck (visible in the admin), fences off whoever may still run it (advance_fences), and we
# drop its lease so no sweeper retries it.
GIVE_UP_LEASE = "DELETE FROM leases_lease WHERE execution_id = ANY(%(eids)s::text[])"

# -- inline leases: the companion CTEs of the flows bootstrap and settle statements --
# (journal/flows/ownership.py Companion; eager mode, fresh starts.) The lease is inserted FROM the
# bootstrap's fence CTE: it exists iff this start won its sequence-0 bootstrap, at token 1, in the
# same commit as the fence (a refused start writes none; a crash before the commit leaves neither).
# On conflict (a row left for an id whose stream was removed) it is overwritten: the fence was
# created by this very statement, so this run is the execution's only holder. The settle deletes
# the lease only if the settling events were inserted (EXISTS ins) and only at this owner and
# token: a settle refused by the fence (taken over) leaves the new owner's lease alone.
LEASE_BOOT_CTE = """
, lease_boot AS (
    INSERT INTO leases_lease AS l (execution_id, owner, fence_token, acquired_at, renewed_at, expires_at)
    SELECT f.stream_id, %(lease_owner)s, 1, now(), now(), now() + %(lease_ttl)s::float8 * interval '1 second'
    FROM fence f
    ON CONFLICT (execution_id) DO UPDATE SET owner = EXCLUDED.owner, fence_token = 1,
        acquired_at = EXCLUDED.acquired_at, renewed_at = EXCLUDED.renewed_at, expires_at = EXCLUDED.expires_at,
        handed_back = false
)"""
# The coalesced form: only streams that won their fence AND asked for a lease (a NULL owner: a
# run of another mode, or inside a transaction), inserted in execution_id order like ACQUIRE.
LEASE_BOOT_MANY_CTE = """
, lease_boot AS (
    INSERT INTO leases_lease AS l (execution_id, owner, fence_token, acquired_at, renewed_at, expires_at)
    SELECT o.eid, o.owner, 1, now(), now(), now() + o.ttl * interval '1 second'
    FROM unnest(%(sids)s::text[], %(lease_owners)s::text[], %(lease_ttls)s::float8[]) AS o(eid, owner, ttl)
    JOIN fence f ON f.stream_id = o.eid
    WHERE o.owner IS NOT NULL
    ORDER BY o.eid
    ON CONFLICT (execution_id) DO UPDATE SET owner = EXCLUDED.owner, fence_token = 1,
        acquired_at = EXCLUDED.acquired_at, renewed_at = EXCLUDED.renewed_at, expires_at = EXCLUDED.expires_at,
        handed_back = false
)"""
LEASE_SETTLE_CTE = """
, lease_end AS (
    DELETE FROM leases_lease
    WHERE execution_id = %(hid)s AND owner = %(lease_owner)s AND fence_token = %(lease_token)s
      AND EXISTS (SELECT 1 FROM ins)
)"""
# The coalesced form locks the rows in execution_id order (as RELEASE does), so a renew_many of
# the same owner's leases, which locks in the same order, waits instead of deadlocking.
LEASE_SETTLE_MANY_CTE = """
, lease_end AS (
    DELETE FROM leases_lease WHERE execution_id IN (
        SELECT l.execution_id FROM leases_lease l
        JOIN unnest(%(lease_eids)s::text[], %(lease_owners)s::text[], %(lease_tokens)s::bigint[]) AS x(eid, owner, tok)
          ON l.execution_id = x.eid AND l.owner = x.owner AND l.fence_token = x.tok
        WHERE x.eid IN (SELECT stream_id FROM ins)
        ORDER BY l.execution_id
        FOR UPDATE OF l
    )
)"""
COMPANION = Companion(LEASE_BOOT_CTE, LEASE_BOOT_MANY_CTE, LEASE_SETTLE_CTE, LEASE_SETTLE_MANY_CTE)

# -- keeper session --
# The keeper's connection commits asynchronously: lease rows are soft state. Losing the last
# acquires/renewals/releases in a database crash is harmless by construction: a lost acquire
# looks like an orphan (taken over after grace + TTL, with a fence advance), a lost renewal like
# an earlier expiry (taken over, fenced), a lost release like a lease on a settled execution
# (never swept). Safety lives in the fence, whose advance (takeover, resume) stays synchronous:
# it runs on other connections. This removes the WAL flush wait from every lease statement.
KEEPER_SESSION = "SET synchronous_commit = off"

# -- worker: touch --
TOUCH_WORKER = """
INSERT INTO leases_worker (id, host, pid, role, started_at, seen_at, stopped_at)
VALUES (%s, %s, %s, %s, now(), now(), NULL)
ON CONFLICT (id) DO UPDATE SET seen_at = now(), stopped_at = NULL, host = EXCLUDED.host, pid = EXCLUDED.pid,
    role = EXCLUDED.role
"""

STOP_WORKER = "UPDATE leases_worker SET stopped_at = now(), seen_at = now() WHERE id = %s"

# -- worker: prune --
# Rows of workers gone for longer than the retention, unless a lease still names them (the lease
# admin links its owner; such a lease is expired and the next sweep moves it anyway). No lock
# beyond the delete's own: a worker that comes back re-inserts its row at its next tick.
PRUNE_WORKERS = """
DELETE FROM leases_worker w
WHERE w.seen_at < now() - %(older)s::float8 * interval '1 second'
  AND NOT EXISTS (SELECT 1 FROM leases_lease l WHERE l.owner = w.id)
"""

# -- count_leases_expired_for -- (the fault suite's failover scenario; the database clock, as every expiry)
# Lease rows of running executions under a prefix that expired more than `older` seconds ago: nobody renewed
# them and no recovery sweep took the execution over in that time. No lock: a count the suite samples.
# The header's status through the journal's fragment (journal/store/base.py EXECUTION_STATUS_OF): the journal's
# table is named only in the journal's store.
COUNT_LEASES_EXPIRED_FOR = (
    "SELECT count(*) FROM leases_lease l WHERE l.execution_id LIKE %(prefix)s AND "
    + EXECUTION_STATUS_OF.format(eid="l.execution_id")
    + " = 'running' AND l.expires_at < now() - %(older)s::float8 * interval '1 second'"
)

# -- prune_settled_leases -- (leases/store/base.py: the database clock)
PRUNE_SETTLED_LEASES = base.PRUNE_SETTLED_LEASES.format(now="now()")

# == schedules (leases/schedules.py) ===================================================================

# -- schedule: save --
# An upsert by name. The row's next tick survives an update (a worker restart re-saves every code
# schedule) unless the cron or the time zone changed (the same cron names other instants in another
# zone) or a disabled schedule is enabled again; then the new definition's first tick replaces it, so
# the missed ticks of a disabled schedule are never caught up.
SAVE_SCHEDULE = """
INSERT INTO leases_schedule AS s (name, cron, timezone, flow, input, catch_up, queue, enabled, source,
                                  next_tick_at, last_tick_at, last_execution_id, created_at, updated_at)
VALUES (%(name)s, %(cron)s, %(timezone)s, %(flow)s, %(input)s::jsonb, %(catch_up)s, %(queue)s, %(enabled)s,
        %(source)s, %(next)s, NULL, '', now(), now())
ON CONFLICT (name) DO UPDATE SET cron = EXCLUDED.cron, timezone = EXCLUDED.timezone, flow = EXCLUDED.flow,
    input = EXCLUDED.input, catch_up = EXCLUDED.catch_up, queue = EXCLUDED.queue, enabled = EXCLUDED.enabled,
    source = EXCLUDED.source,
    next_tick_at = CASE WHEN s.cron = EXCLUDED.cron AND s.timezone = EXCLUDED.timezone
                             AND (s.enabled OR NOT EXCLUDED.enabled)
                        THEN s.next_tick_at ELSE EXCLUDED.next_tick_at END,
    updated_at = now()
"""

# -- schedule: claim due --
# The due schedules of the flows this worker can start, oldest tick first. FOR UPDATE SKIP LOCKED:
# a schedule another worker is ticking is passed over, not waited for: that worker advances its next
# tick before it commits, so by then the row is no longer due and waiting would only re-read it. The
# lock is held until the caller's transaction commits its starts and the advance together, so two
# workers never both start the ticks of one schedule (and if they did, the tick's execution id,
# derived from the schedule and the tick, would make the second start a no-op). now() is the
# transaction's start, the one clock every host shares.
CLAIM_DUE_SCHEDULES = """
SELECT name, cron, flow, input, catch_up, queue, next_tick_at, timezone, now() FROM leases_schedule
WHERE enabled AND paused_at IS NULL AND next_tick_at <= now() AND (%(any_flow)s OR flow = ANY(%(flows)s::text[]))
ORDER BY next_tick_at, name
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
"""

# -- schedule: now -- (the clock a claim that found nothing due compared against)
DATABASE_NOW = "SELECT now()"

# -- schedule: advance --
# Under the claim's row lock (same transaction).
ADVANCE_SCHEDULE = """
UPDATE leases_schedule SET next_tick_at = %(next)s, last_tick_at = COALESCE(%(last)s, last_tick_at),
    last_execution_id = COALESCE(%(eid)s, last_execution_id), updated_at = now()
WHERE name = %(name)s
"""


def _schedule_params(row) -> dict:
    return {"name": row.name, "cron": row.cron, "timezone": row.timezone, "flow": row.flow, "input": row.input,
            "catch_up": row.catch_up, "queue": row.queue, "enabled": row.enabled, "source": row.source,
            "next": row.next_tick_at}


class PostgresSchedules:
    """The schedule statements of PostgresLeaseStore (mixed in below)."""

    def save_schedule(self, row):
        self._count(SAVE_SCHEDULE, _schedule_params(row))

    def claim_due_schedules(self, limit, flows=None):
        rows = self._rows(CLAIM_DUE_SCHEDULES, {"limit": limit, "any_flow": flows is None, "flows": list(flows or [])})
        if not rows:
            return self._rows(DATABASE_NOW, [])[0][0], []
        # Django's psycopg loaders hand jsonb back as its text (the JSONField decodes it): decode here too.
        return rows[0][8], [DueSchedule(name, cron, flow, json.loads(data) if isinstance(data, str) else data,
                                        catch_up, queue, due, zone)
                            for name, cron, flow, data, catch_up, queue, due, zone, _ in rows]

    def advance_schedule(self, name, next_tick_at, last_tick_at, last_execution_id):
        self._count(ADVANCE_SCHEDULE, {"name": name, "next": next_tick_at, "last": last_tick_at,
                                       "eid": last_execution_id})


_prepared: weakref.WeakSet = weakref.WeakSet()  # raw connections already tuned


def _split(items: Sequence[Item]) -> tuple[list[str], list[int]]:
    return [i[0] for i in items], [i[1] for i in items]


# -- prune_reservations --
# The reservations whose execution began (leases/store/base.py PRUNE_RESERVATIONS), with this backend's
# journal hook for "the execution has a header": one statement, no lock (a header is never deleted).
PRUNE_RESERVATIONS = base.PRUNE_RESERVATIONS.format(
    begun=journal_sql.EXECUTION_EXISTS.format(eid="leases_startreservation.execution_id"))


class PostgresLeaseStore(PostgresSchedules, LeaseStore):
    prune_reservations_sql = PRUNE_RESERVATIONS

    vendor = "postgresql"
    companion = COMPANION

    def prepare_keeper_session(self) -> None:
        self.connection.ensure_connection()
        raw = self.connection.connection
        if journal_sql.behind_pooler(self.connection):
            return  # a session SET would leak to other clients' transactions on the pooled server connection
        if raw not in _prepared:
            with self.connection.cursor() as cursor:
                cursor.execute(KEEPER_SESSION)
            _prepared.add(raw)

    def acquire_many(self, owner, items, ttl, release=(), handed_back=False):
        if not items:
            if release:
                self.release_many(owner, release)
            return set()
        eids, tokens = _split(items)
        params = {"owner": owner, "ttl": ttl, "eids": eids, "tokens": tokens, "handed_back": handed_back}
        if release:
            params["rel_eids"], params["rel_tokens"] = _split(release)
            return {r[0] for r in self._rows(ACQUIRE_RELEASING, params)}
        return {r[0] for r in self._rows(ACQUIRE, params)}

    def renew_many(self, owner, items, ttl):
        if not items:
            return set()
        eids, tokens = _split(items)
        rows = self._rows(RENEW_MANY, {"owner": owner, "ttl": ttl, "eids": eids, "tokens": tokens})
        return {r[0] for r in rows}

    def release_many(self, owner, items):
        if not items:
            return 0
        eids, tokens = _split(items)
        return self._count(RELEASE, {"owner": owner, "eids": eids, "tokens": tokens})

    def expire_many(self, owner, items, graceful=False):
        if not items:
            return 0
        eids, tokens = _split(items)
        return self._count(EXPIRE, {"owner": owner, "eids": eids, "tokens": tokens, "graceful": graceful})

    def takeover(self, owner, ttl, orphan_after, max_attempts, limit, flows=None, orphan_window=None):
        keys = [json.dumps([name, version]) for name, version in zip(*flow_keys(flows or []), strict=True)]
        with atomic(self.alias):
            candidates = self._rows(TAKEOVER_CANDIDATES, {"orphan": orphan_after, "window": orphan_window,
                                                          "limit": limit, "any_flow": flows is None, "flows": keys})
            if not candidates:
                return Takeover()
            claimed = dict(self._rows(TAKEOVER_CLAIM, {"owner": owner, "ttl": ttl,
                                                       "eids": [eid for eid, _, _ in candidates]}))
            stuck, retry = split_stuck(candidates, claimed, max_attempts)
            journal = journal_store(self.alias)
            if stuck:
                journal.mark_stuck(stuck)
                journal.advance_fences(stuck)
                self._count(GIVE_UP_LEASE, {"eids": stuck})
            taken: list[Item] = []
            if retry:
                taken = journal.advance_fences(retry)
                eids, tokens = _split(taken)
                self._count(TAKEOVER_TOKEN, {"eids": eids, "tokens": tokens})
                unfenced = set(retry) - set(eids)
                if unfenced:  # no fence row: not a durable execution stream; leave it alone
                    self._count(GIVE_UP_LEASE, {"eids": sorted(unfenced)})
            return Takeover(sorted(taken), sorted(stuck), {eid: flow for eid, _, flow in candidates},
                            handed_back=sorted(eid for eid, _ in taken if claimed[eid]))

    def touch_worker(self, worker_id, host, pid, role=""):
        with self.connection.cursor() as cursor:
            cursor.execute(TOUCH_WORKER, [worker_id, host, pid, role])

    def prune_workers(self, older_than):
        return self._count(PRUNE_WORKERS, {"older": older_than})

    def prune_settled_leases(self):
        return self._count(PRUNE_SETTLED_LEASES, [])

    def count_leases_expired_for(self, prefix: str, older: float) -> int:
        """Leases of running executions under `prefix` expired more than `older` s ago (database clock)."""
        with self.connection.cursor() as cursor:
            cursor.execute(COUNT_LEASES_EXPIRED_FOR, {"prefix": prefix + "%", "older": older})
            return cursor.fetchone()[0]

    def stop_worker(self, worker_id):
        with self.connection.cursor() as cursor:
            cursor.execute(STOP_WORKER, [worker_id])

