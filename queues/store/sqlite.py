"""Queues on SQLite: the same statements as PostgreSQL, serialised by SQLite's single writer.

SQLite is a single-host store, so times come from this host's clock (one clock for every process
sharing the file), in Django's text format, which compares correctly as text. No row locks: the
dequeue's transaction begins IMMEDIATE (the database's `transaction_mode`, system check loom.W001),
so it holds the write lock from its first read: the running count and the claim are one decision,
and no other worker's claim, enqueue or cancel can slip in between.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from journal.atomic import atomic
from journal.store.base import EXECUTION_STATUS_OF, EXECUTION_VERSION_OF, flow_keys
from leases.store.sqlite import stamp
from queues.store.base import (
    SETTLED,
    Caps,
    Claimed,
    Existing,
    QueueStats,
    QueueStore,
    begun_late,
    check_room,
    decode,
    not_begun,
)

STATUS = EXECUTION_STATUS_OF.format(eid="q.execution_id")
NOT_BEGUN = not_begun("q", STATUS)
NOT_BEGUN_X, BEGUN_LATE_X = not_begun("x", "x.status"), begun_late("x")
SETTLED_SQL = "(" + ", ".join(f"'{s}'" for s in SETTLED) + ")"
VERSION = EXECUTION_VERSION_OF.format(eid="q.execution_id")

# -- fragment: RUNNABLE -- (see postgres.py) %(flows)s: a JSON array of [name, version] pairs (version 0: any
# version), journal.store.base.flow_keys's; the header's version decides, an entry without one matches by name.
RUNNABLE = f"""EXISTS (SELECT 1 FROM json_each(%(flows)s) f
               WHERE json_extract(f.value, '$[0]') = q.flow
                 AND json_extract(f.value, '$[1]') IN (0, COALESCE({VERSION}, json_extract(f.value, '$[1]'))))"""

# -- has_queue --
HAS_QUEUE = "SELECT 1 FROM queues_queue WHERE name = %s"

# -- upsert_queue -- (see postgres.py)
UPSERT_QUEUE = """
INSERT INTO queues_queue (name, concurrency, partition_concurrency, rate_limit, rate_period, updated_at)
VALUES (%(name)s, %(concurrency)s, %(partition)s, %(rate)s, %(period)s, %(now)s)
ON CONFLICT (name) DO UPDATE SET concurrency = excluded.concurrency,
    partition_concurrency = excluded.partition_concurrency, rate_limit = excluded.rate_limit,
    rate_period = excluded.rate_period, updated_at = excluded.updated_at
"""

# -- enqueue: free the dedup id -- (see postgres.py)
FREE_DEDUP = f"""
UPDATE queues_entry AS q SET state = 'done', finished_at = %(now)s
WHERE q.queue_id = %(queue)s AND q.dedup_id = %(dedup)s AND q.state IN ('pending', 'started')
  AND {STATUS} IN {SETTLED_SQL}
"""

# -- enqueue: queue row -- (see postgres.py: created from the enqueuer's declaration if missing)
ENSURE_QUEUE = """
INSERT INTO queues_queue (name, concurrency, partition_concurrency, rate_limit, rate_period, updated_at)
VALUES (%(queue)s, %(concurrency)s, %(partition_cap)s, %(rate)s, %(period)s, %(now)s)
ON CONFLICT (name) DO NOTHING
"""

# -- enqueue: insert -- (see postgres.py: every unique index arbitrates)
INSERT_ENTRY = """
INSERT INTO queues_entry (queue_id, execution_id, flow, input, meta, partition_key, priority, dedup_id, state,
                          run_after, enqueued_at, worker, attempts)
VALUES (%(queue)s, %(eid)s, %(flow)s, %(input)s, %(meta)s, %(partition)s, %(priority)s, %(dedup)s, 'pending',
        %(run_after)s, %(now)s, '', 0)
ON CONFLICT DO NOTHING
RETURNING id
"""

# -- enqueue: existing --
EXISTING_ENTRY = """
SELECT execution_id, flow, input, (%(dedup)s IS NOT NULL AND dedup_id = %(dedup)s AND queue_id = %(queue)s
                                   AND state IN ('pending', 'started')) AS by_dedup
FROM queues_entry
WHERE execution_id = %(eid)s
   OR (%(dedup)s IS NOT NULL AND queue_id = %(queue)s AND dedup_id = %(dedup)s AND state IN ('pending', 'started'))
ORDER BY by_dedup DESC
LIMIT 1
"""

# -- upsert_resume -- (see postgres.py; the queue row first, as an enqueue does)
UPSERT_RESUME = """
INSERT INTO queues_entry (queue_id, execution_id, flow, input, meta, partition_key, priority, dedup_id, state,
                          run_after, enqueued_at, worker, attempts, resume_fence, resume_force)
VALUES (%(queue)s, %(eid)s, %(flow)s, '', '', NULL, %(priority)s, NULL, 'pending', %(now)s, %(now)s, '', 0,
        %(fence)s, %(force)s)
ON CONFLICT (execution_id) DO UPDATE SET state = 'pending', resume_fence = excluded.resume_fence,
    resume_force = excluded.resume_force, run_after = excluded.run_after, worker = '', begun_at = NULL,
    finished_at = NULL
WHERE queues_entry.state <> 'pending' OR queues_entry.resume_fence IS NOT NULL
"""

# -- ready_queues -- (see postgres.py)
READY_QUEUES = f"""
SELECT qq.name FROM queues_queue qq
WHERE qq.paused_at IS NULL
  AND (EXISTS (SELECT 1 FROM queues_entry q WHERE q.queue_id = qq.name AND q.state = 'pending'
              AND q.run_after <= %(now)s AND {RUNNABLE})
   OR EXISTS (SELECT 1 FROM queues_entry q WHERE q.queue_id = qq.name AND q.state = 'started'
              AND q.started_at < %(claim_cutoff)s AND {NOT_BEGUN}))
"""

# -- next_due -- (see postgres.py; SQLite never notifies, so only tests and the contract read it)
NEXT_DUE = f"""
SELECT min(q.run_after) FROM queues_entry q WHERE q.state = 'pending' AND q.run_after > %(now)s AND {RUNNABLE}
"""

# -- dequeue: read the queue -- under the write lock the transaction took at BEGIN (IMMEDIATE)
# The pause (queues/pause.py) is read under the same write lock as the claim: a pause committed before it is seen.
LOCK_QUEUE = """
SELECT concurrency, partition_concurrency, rate_limit, rate_period, paused_at IS NOT NULL FROM queues_queue
WHERE name = %(queue)s
"""

# -- dequeue: sync / running / rate window -- (see postgres.py)
SYNC = f"""
UPDATE queues_entry SET state = y.next,
    finished_at = CASE WHEN y.next = 'done' THEN %(now)s ELSE queues_entry.finished_at END
FROM (
    SELECT x.id, CASE
        WHEN x.status IN {SETTLED_SQL} THEN 'done'
        WHEN x.state = 'started' AND {NOT_BEGUN_X} AND x.started_at < %(claim_cutoff)s THEN 'pending'
        WHEN x.state = 'pending' AND {BEGUN_LATE_X} THEN 'started'
    END AS next
    FROM (SELECT q.id, q.state, q.started_at, q.begun_at, q.resume_fence, {STATUS} AS status FROM queues_entry q
          WHERE q.queue_id = %(queue)s AND (q.state = 'started' OR (q.state = 'pending' AND q.attempts > 0))) x
) y
WHERE queues_entry.id = y.id AND y.next IS NOT NULL AND y.next <> queues_entry.state
"""
RUNNING = """
SELECT partition_key, count(*) FROM queues_entry WHERE queue_id = %(queue)s AND state = 'started' GROUP BY partition_key
"""
RECENT = "SELECT count(*) FROM queues_entry WHERE queue_id = %(queue)s AND started_at > %(rate_cutoff)s"

# -- dequeue: candidates -- (see postgres.py; no SKIP LOCKED: nobody else writes while we hold the lock)
CANDIDATES = f"""
SELECT q.id, q.partition_key, q.priority FROM queues_entry q
WHERE q.queue_id = %(queue)s AND q.state = 'pending' AND q.run_after <= %(now)s AND {RUNNABLE}
  AND (q.priority < %(after_priority)s OR (q.priority = %(after_priority)s AND q.id > %(after_id)s))
ORDER BY q.priority DESC, q.id
LIMIT %(page)s
"""

# -- dequeue: claim -- (see postgres.py; the lag from the two stamps the store wrote, both from `_now()`)
CLAIM = """
UPDATE queues_entry SET state = 'started', started_at = %(now)s, worker = %(owner)s, attempts = attempts + 1,
    begun_at = NULL
WHERE id IN (SELECT value FROM json_each(%(ids)s))
RETURNING id, execution_id, flow, input, meta, attempts, resume_fence, resume_force,
    (julianday(started_at) - julianday(run_after)) * 86400.0
"""

# -- queue_stats -- (see postgres.py: one grouped pass over the pending set)
QUEUE_STATS = f"""
WITH waiting AS (
    SELECT queue_id, count(*) AS pending, count(*) FILTER (WHERE run_after <= %(now)s) AS ready
    FROM queues_entry WHERE state = 'pending' GROUP BY queue_id
)
SELECT qq.name, qq.concurrency, qq.partition_concurrency, qq.rate_limit, qq.rate_period,
    COALESCE(w.pending, 0), COALESCE(w.ready, 0),
    (SELECT count(*) FROM queues_entry q WHERE q.queue_id = qq.name AND q.state = 'started'
        AND COALESCE({STATUS}, 'running') NOT IN {SETTLED_SQL})
FROM queues_queue qq LEFT JOIN waiting w ON w.queue_id = qq.name ORDER BY qq.name
"""

# -- prune_entries -- (see postgres.py; the rate window's cutoff per queue in Python: no interval type)
PRUNE_ENTRIES = """
DELETE FROM queues_entry
WHERE state IN ('done', 'cancelled') AND finished_at < %(cutoff)s
  AND (started_at IS NULL OR started_at < strftime('%%Y-%%m-%%d %%H:%%M:%%f', %(now)s,
       '-' || COALESCE((SELECT qq.rate_period FROM queues_queue qq WHERE qq.name = queues_entry.queue_id), 0)
       || ' seconds'))
"""

# -- cancel_pending / begin -- (see postgres.py; one writer at a time orders them)
CANCEL_PENDING = f"""
UPDATE queues_entry AS q SET state = 'cancelled', finished_at = %s
WHERE q.execution_id = %s AND (q.state = 'pending'
    OR (q.state = 'started' AND q.begun_at IS NULL
        AND (q.resume_fence IS NOT NULL OR COALESCE({STATUS}, 'queued') IN ('queued', 'cancelled'))))
"""
BEGIN = """
UPDATE queues_entry SET begun_at = %s
WHERE execution_id = %s AND state = 'started' AND worker = %s AND attempts = %s AND begun_at IS NULL
"""

# -- set_priority -- (see postgres.py; the write lock orders it with a dequeue's claim)
SET_PRIORITY = """
UPDATE queues_entry SET priority = %(priority)s
WHERE id IN (SELECT value FROM json_each(%(ids)s)) AND state = 'pending'
RETURNING id
"""

# -- reopen -- (see postgres.py; the write lock of the retry's transaction serialises it)
DONE_ENTRY = "SELECT id, queue_id, partition_key FROM queues_entry WHERE execution_id = %s AND state = 'done'"
REOPEN = "UPDATE queues_entry SET state = 'started', finished_at = NULL WHERE id = %(id)s AND state = 'done'"

NO_KEY = (101, 0)


def _keys(flows) -> str:
    """A worker's flows filter as RUNNABLE's JSON [name, version] pairs (journal.store.base.flow_keys)."""
    return json.dumps([list(key) for key in zip(*flow_keys(flows), strict=True)])


def _now() -> datetime:
    return datetime.now(UTC)


class SqliteQueueStore(QueueStore):
    vendor = "sqlite"
    CANDIDATES = CANDIDATES

    def has_queue(self, name):
        return bool(self._rows(HAS_QUEUE, [name]))

    def upsert_queue(self, spec):
        self._count(UPSERT_QUEUE, {"name": spec.name, "concurrency": spec.concurrency,
                                   "partition": spec.partition_concurrency, "rate": spec.rate_limit,
                                   "period": spec.rate_period, "now": stamp(_now())})

    def insert_entry(self, entry):
        # BEGIN IMMEDIATE: the dedup check, the insert and the read of the winner under one write lock.
        with atomic(self.alias):
            now = _now()
            params = {"queue": entry.queue, "eid": entry.execution_id, "flow": entry.flow, "input": entry.input,
                      "meta": entry.meta, "partition": entry.partition_key, "priority": entry.priority,
                      "dedup": entry.dedup_id, "now": stamp(now),
                      "run_after": stamp(entry.run_after if entry.run_after is not None else now)}
            if entry.caps is not None:
                self._count(ENSURE_QUEUE, {**params, **dict(zip(("concurrency", "partition_cap", "rate", "period"),
                                                                 entry.caps, strict=True))})
            if entry.dedup_id is not None:
                self._count(FREE_DEDUP, params)
            if self._rows(INSERT_ENTRY, params):
                return None
            eid, flow, text, by_dedup = self._rows(EXISTING_ENTRY, params)[0]
        return Existing(eid, flow, decode(text), bool(by_dedup))

    def upsert_resume(self, entry):
        with atomic(self.alias):
            params = {"queue": entry.queue, "eid": entry.execution_id, "flow": entry.flow,
                      "priority": entry.priority, "fence": entry.resume_fence, "force": entry.resume_force,
                      "now": stamp(_now())}
            if entry.caps is not None:
                self._count(ENSURE_QUEUE, {**params, **dict(zip(("concurrency", "partition_cap", "rate", "period"),
                                                                 entry.caps, strict=True))})
            return self._count(UPSERT_RESUME, params) == 1

    def _now_param(self):
        return stamp(_now())  # the text form every timestamp of these tables has here

    def ready_queues(self, flows, claim_timeout):
        now = _now()
        return [r[0] for r in self._rows(READY_QUEUES, {
            "flows": _keys(flows), "now": stamp(now),
            "claim_cutoff": stamp(now - timedelta(seconds=claim_timeout))})]

    def next_due(self, flows):
        now = _now()
        due = self._rows(NEXT_DUE, {"flows": _keys(flows), "now": stamp(now)})[0][0]
        return None if due is None else (datetime.fromisoformat(due).replace(tzinfo=UTC) - now).total_seconds()

    def dequeue(self, queue, owner, limit, flows, claim_timeout):
        if limit <= 0:
            return []
        with atomic(self.alias):
            now = _now()
            params = {"queue": queue, "flows": _keys(flows), "owner": owner, "now": stamp(now),
                      "claim_cutoff": stamp(now - timedelta(seconds=claim_timeout))}
            row = self._rows(LOCK_QUEUE, params)
            if not row or row[0][4]:
                return []  # no row, or paused (queues/pause.py): nothing is claimed
            caps = Caps(*row[0][:4])
            self._count(SYNC, params)
            caps.running = {key: n for key, n in self._rows(RUNNING, params)}
            want = min(limit, caps.concurrency - caps.total)
            if caps.rate_limit is not None and want > 0:
                cutoff = stamp(now - timedelta(seconds=caps.rate_period))
                recent = self._rows(RECENT, {**params, "rate_cutoff": cutoff})[0][0]
                want = min(want, caps.rate_limit - recent)
            if want <= 0:
                return []
            ids = self._candidates(caps, params, want, NO_KEY)
            if not ids:
                return []
            rows = self._rows(CLAIM, {"ids": json.dumps(ids), "owner": owner, "now": stamp(now)})
        by_id = {r[0]: r for r in rows}
        return [Claimed(r[1], r[2], decode(r[3]), decode(r[4]), r[5], owner, r[6], bool(r[7]), queue, r[8])
                for r in (by_id[i] for i in ids)]

    def queue_stats(self):
        return [QueueStats(*r) for r in self._rows(QUEUE_STATS, {"now": stamp(_now())})]

    def reopen(self, execution_id):
        with atomic(self.alias):
            found = self._rows(DONE_ENTRY, [execution_id])
            if not found:
                return False
            entry_id, queue, key = found[0]
            now = _now()
            params = {"queue": queue, "id": entry_id, "now": stamp(now),
                      "claim_cutoff": stamp(now - timedelta(days=36500))}  # no re-offer here
            caps = Caps(*self._rows(LOCK_QUEUE, params)[0][:4])
            self._count(SYNC, params)
            caps.running = {k: n for k, n in self._rows(RUNNING, params)}
            check_room(queue, key, caps)
            return self._count(REOPEN, params) == 1

    def prune_entries(self, older_than):
        now = _now()
        return self._count(PRUNE_ENTRIES, {"cutoff": stamp(now - timedelta(seconds=older_than)),
                                           "now": now.replace(tzinfo=None).isoformat(sep=" ")})

    def cancel_pending(self, execution_id):
        return self._count(CANCEL_PENDING, [stamp(_now()), execution_id]) == 1

    def set_priority(self, ids, priority):
        if not ids:
            return []
        return sorted(r[0] for r in self._rows(SET_PRIORITY, {"ids": json.dumps(list(ids)), "priority": priority}))

    def begin(self, execution_id, worker, attempts):
        return self._count(BEGIN, [stamp(_now()), execution_id, worker, attempts]) == 1
