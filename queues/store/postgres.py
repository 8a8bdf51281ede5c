"""Queues on PostgreSQL: every statement, named, with the reason for each lock.

Times come from the database clock (now()): workers on several hosts share the tables, and a
not-before time, a claim's age or a rate window must mean the same to all of them.

Lock order: a dequeue locks its queue's row, then candidate entry rows (SKIP LOCKED), then updates
started entries; an enqueue and a cancel lock one entry row each and never a queue row; an upsert of
a queue locks only its row. No statement waits for a queue row while holding an entry row, so they
cannot deadlock.
"""

from __future__ import annotations

from journal.atomic import atomic
from journal.store.base import EXECUTION_STATUS_OF, EXECUTION_VERSION_OF, flow_keys
from queues import conf
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

# -- fragment: RUNNABLE -- (of READY_QUEUES, NEXT_DUE, CANDIDATES) entry q is of a flow version this worker
# has: %(flows)s and %(versions)s are journal.store.base.flow_keys's parallel lists (version 0: any
# version), the version is the execution's header's (stamped at enqueue: the version it is pinned to), and
# an entry without a header (written before queued executions) matches by its flow name, as before. An
# entry of another version is left, unread beyond this probe and unlocked, to a worker that has it. No lock
# (a subquery of the WHERE: FOR UPDATE locks only the statement's own FROM rows).
RUNNABLE = f"""EXISTS (SELECT 1 FROM unnest(%(flows)s::text[], %(versions)s::int[]) AS f(flow, version)
               WHERE f.flow = q.flow
                 AND (f.version = 0 OR f.version = COALESCE({VERSION}, f.version)))"""

# -- resume_queue: wake the dispatchers -- (the pending entries of a resumed queue are claimable again)
NOTIFY_QUEUE = "SELECT pg_notify(%s, %s)"

# -- has_queue --
HAS_QUEUE = "SELECT 1 FROM queues_queue WHERE name = %s"

# -- upsert_queue --
# A declaration replaces the caps (the last process that declared the queue wins). It waits for a
# dequeue holding the row: the new caps apply from the next dequeue on.
UPSERT_QUEUE = """
INSERT INTO queues_queue (name, concurrency, partition_concurrency, rate_limit, rate_period, updated_at)
VALUES (%(name)s, %(concurrency)s, %(partition)s, %(rate)s, %(period)s, now())
ON CONFLICT (name) DO UPDATE SET concurrency = EXCLUDED.concurrency,
    partition_concurrency = EXCLUDED.partition_concurrency, rate_limit = EXCLUDED.rate_limit,
    rate_period = EXCLUDED.rate_period, updated_at = now()
"""

# -- enqueue: free the dedup id --
# A started entry whose execution settled no longer holds its dedup id, even before a dequeue marked
# it done: mark it now, so that the insert below is not refused by a finished execution.
FREE_DEDUP = f"""
UPDATE queues_entry q SET state = 'done', finished_at = now()
WHERE q.queue_id = %(queue)s AND q.dedup_id = %(dedup)s AND q.state IN ('pending', 'started')
  AND {STATUS} IN {SETTLED_SQL}
"""

# -- enqueue: insert --
# ON CONFLICT DO NOTHING (no target: every unique index arbitrates): the unique execution id and the
# partial unique (queue, dedup_id) of live entries. Two racing enqueues of one dedup id or id: the
# second waits for the first's row to commit, then inserts nothing and reads the winner below.
# The queue row is created from the enqueuer's declaration if it is missing (DO NOTHING: an existing
# row is neither changed nor locked, so an enqueue never waits for a dequeue holding it); the caps
# of an existing row change only through upsert_queue.
# An inserted entry is notified on LOOM_QUEUE_CHANNEL (payload: the queue's name) in the same statement,
# so the notification is delivered when, and only if, the entry commits: idle dispatchers claim it at
# once. A deferred entry is notified too: a dispatcher sleeping past its due time shortens its sleep
# (next_due). Empty channel: no notification. A notifying commit takes PostgreSQL's notify-queue lock.
INSERT_ENTRY = """
WITH queue_row AS (
    INSERT INTO queues_queue (name, concurrency, partition_concurrency, rate_limit, rate_period, updated_at)
    SELECT %(queue)s, %(concurrency)s, %(partition_cap)s, %(rate)s, %(period)s, now()
    WHERE %(concurrency)s::int IS NOT NULL
    ON CONFLICT (name) DO NOTHING
), ins AS (
    INSERT INTO queues_entry (queue_id, execution_id, flow, input, meta, partition_key, priority, dedup_id, state,
                              run_after, enqueued_at, worker, attempts)
    VALUES (%(queue)s, %(eid)s, %(flow)s, %(input)s, %(meta)s, %(partition)s, %(priority)s, %(dedup)s, 'pending',
            COALESCE(%(run_after)s, now()), now(), '', 0)
    ON CONFLICT DO NOTHING
    RETURNING id, queue_id
), note AS (
    SELECT pg_notify(%(channel)s, queue_id) FROM ins WHERE %(channel)s <> ''
)
SELECT id, (SELECT count(*) FROM note) FROM ins
"""

# -- enqueue: existing --
# The entry that won: the live holder of the dedup id first, else the entry of the execution id.
EXISTING_ENTRY = """
SELECT execution_id, flow, input, (%(dedup)s::text IS NOT NULL AND dedup_id = %(dedup)s AND queue_id = %(queue)s
                                   AND state IN ('pending', 'started')) AS by_dedup
FROM queues_entry
WHERE execution_id = %(eid)s
   OR (%(dedup)s::text IS NOT NULL AND queue_id = %(queue)s AND dedup_id = %(dedup)s
       AND state IN ('pending', 'started'))
ORDER BY by_dedup DESC
LIMIT 1
"""

# -- upsert_resume --
# A hand-over's resume (journal.flows.handover): the execution's one entry (execution_id is unique) is
# pending again as a resume from the handed-over fence, in its own queue, or a new entry in the queue
# named; never over a pending start (the execution is queued: its start entry begins it). The upsert
# locks the entry row: it orders with a begin and a cancel like any update of the row. Notified as an
# insert is.
UPSERT_RESUME = """
WITH queue_row AS (
    INSERT INTO queues_queue (name, concurrency, partition_concurrency, rate_limit, rate_period, updated_at)
    SELECT %(queue)s, %(concurrency)s, %(partition_cap)s, %(rate)s, %(period)s, now()
    WHERE %(concurrency)s::int IS NOT NULL
    ON CONFLICT (name) DO NOTHING
), up AS (
    INSERT INTO queues_entry (queue_id, execution_id, flow, input, meta, partition_key, priority, dedup_id, state,
                              run_after, enqueued_at, worker, attempts, resume_fence, resume_force)
    VALUES (%(queue)s, %(eid)s, %(flow)s, '', '', NULL, %(priority)s, NULL, 'pending', now(), now(), '', 0,
            %(fence)s, %(force)s)
    ON CONFLICT (execution_id) DO UPDATE SET state = 'pending', resume_fence = EXCLUDED.resume_fence,
        resume_force = EXCLUDED.resume_force, run_after = now(), worker = '', begun_at = NULL, finished_at = NULL
    WHERE queues_entry.state <> 'pending' OR queues_entry.resume_fence IS NOT NULL
    RETURNING queue_id
), note AS (
    SELECT pg_notify(%(channel)s, queue_id) FROM up WHERE %(channel)s <> ''
)
SELECT (SELECT count(*) FROM up), (SELECT count(*) FROM note)
"""

# -- ready_queues --
# Per queue row, one probe of the due index (queues_entry_due: the range run_after <= now(), so entries
# deferred to later are never read; stops at the first due entry of a flow version it has) and one
# of the started index (a claim whose execution never began). No lock: the dequeue decides.
READY_QUEUES = f"""
SELECT qq.name FROM queues_queue qq
WHERE qq.paused_at IS NULL
  AND (EXISTS (SELECT 1 FROM queues_entry q WHERE q.queue_id = qq.name AND q.state = 'pending'
              AND q.run_after <= now() AND {RUNNABLE})
   OR EXISTS (SELECT 1 FROM queues_entry q WHERE q.queue_id = qq.name AND q.state = 'started'
              AND q.started_at < now() - %(timeout)s::float8 * interval '1 second' AND {NOT_BEGUN}))
"""

# -- next_due --
# Seconds until the earliest deferred entry of these flow versions falls due (NULL: none), by the database
# clock: a listening dispatcher sleeps no longer than that. Per queue row, one ordered probe of the due
# index (queues_entry_due, from now() on; stops at the first entry of a flow version it has). No lock.
NEXT_DUE = f"""
SELECT extract(epoch FROM min(d.run_after) - now())::float8 FROM queues_queue qq
CROSS JOIN LATERAL (SELECT q.run_after FROM queues_entry q
                    WHERE q.queue_id = qq.name AND q.state = 'pending' AND q.run_after > now()
                      AND {RUNNABLE}
                    ORDER BY q.run_after LIMIT 1) d
WHERE qq.paused_at IS NULL
"""

# -- dequeue: lock the queue --
# FOR UPDATE: the queue's claimers are serialised on its row, so the running count read below and
# the claim that follows are one atomic decision across every process and host (two claimers that
# each counted 7 of 8 cannot both claim the eighth). SKIP LOCKED: a dispatcher that finds another
# claiming from this queue skips it (that one is filling the free slots) instead of queueing
# behind it; it comes back at its next poll.
# The row's pause (queues/pause.py) is read under this lock: a pause waits for a dequeue holding the row, and
# every dequeue after its commit sees it, so no dispatcher on any host claims from a paused queue.
LOCK_QUEUE = """
SELECT concurrency, partition_concurrency, rate_limit, rate_period, paused_at IS NOT NULL FROM queues_queue
WHERE name = %(queue)s
FOR UPDATE SKIP LOCKED
"""

# -- dequeue: sync --
# One pass over the queue's started entries and its re-offered ones (normally none), each decided by
# its execution's header, in one statement:
# - settle: started, and the execution settled (completed, failed, cancelled, stuck): done, its slot
#   is free. A running execution whose worker died keeps its slot until the recovery sweep's resume
#   settles it;
# - re-offer: started, and no execution `timeout` after the claim (its worker died between the claim
#   and the execution's first write): pending again. The fixed execution id makes a late start of the
#   first claimer and a second run one execution (the second start is refused, ExecutionExists);
# - adopt: re-offered, and its first claimer began it late after all: started again (counted), or done.
# A re-offer notifies LOOM_QUEUE_CHANNEL (in this statement: delivered at the dequeue's commit), so that
# other idle dispatchers claim what this one has no room for. A settle does not: this dequeue goes on to
# fill the freed slots itself, and the worker whose run settled looks again at once (queues/service.py).
SYNC = f"""
WITH up AS (
UPDATE queues_entry q SET state = y.next, finished_at = CASE WHEN y.next = 'done' THEN now() ELSE q.finished_at END
FROM (
    SELECT x.id, CASE
        WHEN x.status IN {SETTLED_SQL} THEN 'done'
        WHEN x.state = 'started' AND {NOT_BEGUN_X}
             AND x.started_at < now() - %(timeout)s::float8 * interval '1 second' THEN 'pending'
        WHEN x.state = 'pending' AND {BEGUN_LATE_X} THEN 'started'
    END AS next
    FROM (SELECT q.id, q.state, q.started_at, q.begun_at, q.resume_fence, {STATUS} AS status FROM queues_entry q
          WHERE q.queue_id = %(queue)s AND (q.state = 'started' OR (q.state = 'pending' AND q.attempts > 0))) x
) y
WHERE q.id = y.id AND y.next IS NOT NULL AND y.next <> q.state
RETURNING q.state
), note AS (
    SELECT pg_notify(%(channel)s, %(queue)s)
    WHERE %(channel)s <> '' AND EXISTS (SELECT 1 FROM up WHERE state = 'pending')
)
SELECT (SELECT count(*) FROM up), (SELECT count(*) FROM note)
"""

# -- dequeue: running --
RUNNING = """
SELECT partition_key, count(*) FROM queues_entry WHERE queue_id = %(queue)s AND state = 'started' GROUP BY partition_key
"""

# -- dequeue: rate window --
# Starts (claims) of the queue in the last `period` seconds: a sliding window.
RECENT = """
SELECT count(*) FROM queues_entry
WHERE queue_id = %(queue)s AND started_at > now() - %(period)s::float8 * interval '1 second'
"""

# -- dequeue: candidates --
# Pending, due entries of flow versions this worker has (RUNNABLE), in start order (priority, then FIFO),
# one keyset page (the planner reads the due index's range when few are due, the pending index's order
# when many are) at a time. FOR UPDATE SKIP LOCKED: a row locked by a concurrent cancel or enqueue is
# passed over rather than waited for (the queue row already keeps other claimers out).
CANDIDATES = f"""
SELECT q.id, q.partition_key, q.priority FROM queues_entry q
WHERE q.queue_id = %(queue)s AND q.state = 'pending' AND q.run_after <= now() AND {RUNNABLE}
  AND (q.priority < %(after_priority)s OR (q.priority = %(after_priority)s AND q.id > %(after_id)s))
ORDER BY q.priority DESC, q.id
LIMIT %(page)s
FOR UPDATE SKIP LOCKED
"""

# -- dequeue: claim --
# Its row locks are those the candidates already hold (FOR UPDATE SKIP LOCKED above): no new wait.
# It returns the dispatch lag, the claim's `started_at` (now(): the transaction's start, on the database's
# clock) less the entry's due time `run_after` (its enqueue's now() when it had no delay): one clock.
CLAIM = """
UPDATE queues_entry SET state = 'started', started_at = now(), worker = %(owner)s, attempts = attempts + 1,
    begun_at = NULL
WHERE id = ANY(%(ids)s::bigint[])
RETURNING id, execution_id, flow, input, meta, attempts, resume_fence, resume_force,
    extract(epoch FROM started_at - run_after)::float8
"""

# -- queue_stats --
# Admin and command line only (never on a worker's poll): "pending" counts every waiting entry, the
# deferred ones too, so it reads the pending set once (one grouped pass, not a subquery per queue row).
QUEUE_STATS = f"""
WITH waiting AS (
    SELECT queue_id, count(*) AS pending, count(*) FILTER (WHERE run_after <= now()) AS ready
    FROM queues_entry WHERE state = 'pending' GROUP BY queue_id
)
SELECT qq.name, qq.concurrency, qq.partition_concurrency, qq.rate_limit, qq.rate_period,
    COALESCE(w.pending, 0), COALESCE(w.ready, 0),
    (SELECT count(*) FROM queues_entry q WHERE q.queue_id = qq.name AND q.state = 'started'
        AND COALESCE({STATUS}, 'running') NOT IN {SETTLED_SQL})
FROM queues_queue qq LEFT JOIN waiting w ON w.queue_id = qq.name ORDER BY qq.name
"""

# -- prune_entries --
# Finished entries past the retention; never one its queue's rate window still counts. No lock beyond
# the delete's own: a finished entry is read by nobody who decides anything but the rate window.
PRUNE_ENTRIES = """
DELETE FROM queues_entry q USING queues_queue qq
WHERE qq.name = q.queue_id AND q.state IN ('done', 'cancelled')
  AND q.finished_at < now() - %(older)s::float8 * interval '1 second'
  AND (q.started_at IS NULL OR q.started_at < now() - COALESCE(qq.rate_period, 0) * interval '1 second')
"""

# -- cancel_pending --
# Pending, or claimed and not begun (no begin; its execution still queued, or just cancelled by
# journal.flows.cancel, whose hook calls this; or no header: an old entry).
# The UPDATE locks the entry row: it waits for a dequeue that locked the row as a candidate, or for the
# runner's begin; either way the WHERE is re-checked on the row they committed, so a cancel and a begin
# never both succeed. The re-check is of begun_at, a column of the row itself: the header's status is a
# subquery, which the re-check reads in the statement's first snapshot (still queued), not the begin's.
CANCEL_PENDING = f"""
UPDATE queues_entry q SET state = 'cancelled', finished_at = now()
WHERE q.execution_id = %s AND (q.state = 'pending'
    OR (q.state = 'started' AND q.begun_at IS NULL
        AND (q.resume_fence IS NOT NULL OR COALESCE({STATUS}, 'queued') IN ('queued', 'cancelled'))))
"""

# -- set_priority -- (an operator's reprioritise)
# Pending entries only, each under its row lock: a dequeue holds its candidates' rows (FOR UPDATE SKIP
# LOCKED) until its claim commits, so this waits for it and then re-checks `state = 'pending'` against
# the committed row (READ COMMITTED): an entry claimed meanwhile keeps its priority and is not returned.
# Entry rows only, never a queue row (the lock order above); rows in id order, as several may be locked.
SET_PRIORITY = """
UPDATE queues_entry q SET priority = %(priority)s
FROM (SELECT id FROM queues_entry WHERE id = ANY(%(ids)s::bigint[]) AND state = 'pending' ORDER BY id FOR UPDATE) p
WHERE q.id = p.id AND q.state = 'pending'
RETURNING q.id
"""

# -- begin --
# The runner's start is conditional on its claim still standing: the entry row lock orders it with a
# cancel (above) and with a re-offer (SYNC): the later one re-checks its WHERE and does nothing.
BEGIN = """
UPDATE queues_entry SET begun_at = now()
WHERE execution_id = %s AND state = 'started' AND worker = %s AND attempts = %s AND begun_at IS NULL
"""

# -- reopen: the entry --
# No lock: the queue row is locked next, then the entry re-checked by the update's WHERE.
DONE_ENTRY = "SELECT id, queue_id, partition_key FROM queues_entry WHERE execution_id = %s AND state = 'done'"

# -- reopen: lock the queue --
# FOR UPDATE (waiting, not SKIP LOCKED): a retry is counted and decided like a claim, serialised with
# the queue's dequeues (same lock order: the queue row, then its entries).
LOCK_QUEUE_WAIT = """
SELECT concurrency, partition_concurrency, rate_limit, rate_period FROM queues_queue WHERE name = %(queue)s FOR UPDATE
"""

# -- reopen: started again --
REOPEN = """
UPDATE queues_entry SET state = 'started', finished_at = NULL WHERE id = %(id)s AND state = 'done'
"""

NO_KEY = (101, 0)  # a keyset position before every priority (-100..100)


def channel() -> str:
    """LOOM_QUEUE_CHANNEL ("" : no notifications)."""

    return conf.get("LOOM_QUEUE_CHANNEL")


class PostgresQueueStore(QueueStore):
    vendor = "postgresql"
    notifications = True
    CANDIDATES = CANDIDATES

    def has_queue(self, name):
        return bool(self._rows(HAS_QUEUE, [name]))

    def upsert_queue(self, spec):
        self._count(UPSERT_QUEUE, {"name": spec.name, "concurrency": spec.concurrency,
                                   "partition": spec.partition_concurrency, "rate": spec.rate_limit,
                                   "period": spec.rate_period})

    def insert_entry(self, entry):
        params = {"queue": entry.queue, "eid": entry.execution_id, "flow": entry.flow, "input": entry.input,
                  "meta": entry.meta, "partition": entry.partition_key, "priority": entry.priority,
                  "dedup": entry.dedup_id, "run_after": entry.run_after, "channel": channel(),
                  **dict(zip(("concurrency", "partition_cap", "rate", "period"), entry.caps or (None,) * 4,
                             strict=True))}
        for _ in range(3):  # the entry that refused us may finish before we read it: insert again
            with atomic(self.alias):
                if entry.dedup_id is not None:
                    self._count(FREE_DEDUP, params)
                if self._rows(INSERT_ENTRY, params):
                    return None
                found = self._rows(EXISTING_ENTRY, params)
            if found:
                eid, flow, text, by_dedup = found[0]
                return Existing(eid, flow, decode(text), bool(by_dedup))
        raise RuntimeError(f"enqueue of {entry.execution_id!r} kept conflicting with entries that vanished")

    def upsert_resume(self, entry):
        params = {"queue": entry.queue, "eid": entry.execution_id, "flow": entry.flow, "priority": entry.priority,
                  "fence": entry.resume_fence, "force": entry.resume_force, "channel": channel(),
                  **dict(zip(("concurrency", "partition_cap", "rate", "period"), entry.caps or (None,) * 4,
                             strict=True))}
        return self._rows(UPSERT_RESUME, params)[0][0] == 1

    def resume_queue(self, name):
        with atomic(self.alias):
            resumed = super().resume_queue(name)
            if resumed and channel():  # idle dispatchers sleep until notified: wake them (delivered at commit)
                self._rows(NOTIFY_QUEUE, [channel(), name])
        return resumed

    def ready_queues(self, flows, claim_timeout):
        names, versions = flow_keys(flows)
        return [r[0] for r in self._rows(READY_QUEUES, {"flows": names, "versions": versions,
                                                        "timeout": claim_timeout})]

    def next_due(self, flows):
        names, versions = flow_keys(flows)
        return self._rows(NEXT_DUE, {"flows": names, "versions": versions})[0][0]

    def dequeue(self, queue, owner, limit, flows, claim_timeout):
        if limit <= 0:
            return []
        names, versions = flow_keys(flows)
        params = {"queue": queue, "timeout": claim_timeout, "flows": names, "versions": versions, "owner": owner,
                  "channel": channel()}
        with atomic(self.alias):
            row = self._rows(LOCK_QUEUE, params)
            if not row:
                return None  # another worker is claiming from it right now (or the queue has no row)
            if row[0][4]:
                return []  # paused (queues/pause.py): nothing is claimed, not even a re-offer
            caps = Caps(*row[0][:4])
            self._rows(SYNC, params)
            caps.running = {key: n for key, n in self._rows(RUNNING, params)}
            want = min(limit, caps.concurrency - caps.total)
            if caps.rate_limit is not None and want > 0:
                recent = self._rows(RECENT, {**params, "period": caps.rate_period})[0][0]
                want = min(want, caps.rate_limit - recent)
            if want <= 0:
                return []
            ids = self._candidates(caps, params, want, NO_KEY)
            if not ids:
                return []
            rows = self._rows(CLAIM, {"ids": ids, "owner": owner})
        by_id = {r[0]: r for r in rows}
        return [Claimed(r[1], r[2], decode(r[3]), decode(r[4]), r[5], owner, r[6], bool(r[7]), queue, r[8])
                for r in (by_id[i] for i in ids)]

    def queue_stats(self):
        return [QueueStats(*r) for r in self._rows(QUEUE_STATS, [])]

    def reopen(self, execution_id):
        found = self._rows(DONE_ENTRY, [execution_id])
        if not found:
            return False
        entry_id, queue, key = found[0]
        params = {"queue": queue, "timeout": 1e9, "id": entry_id, "channel": channel()}
        with atomic(self.alias):
            caps = Caps(*self._rows(LOCK_QUEUE_WAIT, params)[0])
            self._rows(SYNC, params)
            caps.running = {k: n for k, n in self._rows(RUNNING, params)}
            check_room(queue, key, caps)
            return self._count(REOPEN, params) == 1

    def prune_entries(self, older_than):
        return self._count(PRUNE_ENTRIES, {"older": older_than})

    def cancel_pending(self, execution_id):
        return self._count(CANCEL_PENDING, [execution_id]) == 1

    def set_priority(self, ids, priority):
        if not ids:
            return []
        return sorted(r[0] for r in self._rows(SET_PRIORITY, {"ids": list(ids), "priority": priority}))

    def begin(self, execution_id, worker, attempts):
        return self._count(BEGIN, [execution_id, worker, attempts]) == 1
