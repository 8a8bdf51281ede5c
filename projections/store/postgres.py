"""Reactions and projections on PostgreSQL: every statement, named, with the reason for each lock.

Every statement that writes is ONE statement (autocommit, or inside the caller's transaction for
a projection's ack), so a claim or an ack can never be half-applied.
"""

from __future__ import annotations

from collections.abc import Sequence

from journal.store.postgres import STREAM_TIP_SQL
from projections.store.base import Bump, CheckpointRow, Claim, Clock, ProjectionStore

# -- try_correlate_lock --
# A transaction-scoped advisory lock: only one worker scans the log at a time; the others skip
# (try_, never wait) because the scanner's bumps serve them too. Released at commit/rollback.
CORRELATE_LOCK = "SELECT pg_try_advisory_xact_lock(%s)"
CORRELATE_LOCK_KEY = 0x4C6F6F6D436F72  # "LoomCor"

# -- checkpoints --
# clock_timestamp(), not now(): the safety horizon is measured on the database's clock, which all
# workers share, at the moment of the read.
CHECKPOINTS = """
SELECT consumer, position, horizon_id, horizon_at, horizon_xmax
FROM projections_checkpoint WHERE consumer = ANY(%s)
"""

# -- clock --
# With the time, the snapshot's xmax (first xid not yet assigned) and the oldest xid still running
# in ANOTHER session of THIS database (or prepared in it), as 64-bit xids: a missing journal id can
# only be held by a transaction of this database, so writers elsewhere in the cluster do not hold
# correlation back. pg_snapshot_xip lists the running xids (not our own); pg_stat_activity and
# pg_prepared_xacts say which belong here (32-bit xids: matched modulo 2^32). backend_xid is visible
# to every role. Read before the scan, whose READ COMMITTED snapshot is therefore later.
CLOCK = """
WITH s AS (SELECT pg_current_snapshot() AS snap), here AS (
    SELECT backend_xid::text::bigint AS xid FROM pg_stat_activity
    WHERE datname = current_database() AND backend_xid IS NOT NULL AND pid <> pg_backend_pid()
    UNION ALL
    SELECT transaction::text::bigint FROM pg_prepared_xacts WHERE database = current_database()
)
SELECT clock_timestamp(), pg_snapshot_xmax(snap)::text::bigint,
       COALESCE((SELECT min(x::text::bigint) FROM pg_snapshot_xip(snap) AS x
                 WHERE mod(x::text::bigint, 4294967296) IN (SELECT xid FROM here)),
                pg_snapshot_xmax(snap)::text::bigint)
FROM s
"""

SAVE_CHECKPOINTS = """
INSERT INTO projections_checkpoint (consumer, position, horizon_id, horizon_at, horizon_xmax, updated_at)
SELECT * , now() FROM unnest(%s::text[], %s::bigint[], %s::bigint[], %s::timestamptz[], %s::bigint[])
ON CONFLICT (consumer) DO UPDATE SET position = EXCLUDED.position, horizon_id = EXCLUDED.horizon_id,
    horizon_at = EXCLUDED.horizon_at, horizon_xmax = EXCLUDED.horizon_xmax, updated_at = now()
"""

# -- bump --
# Subscribe and raise tips in one upsert. Rows go in (consumer, stream) order so two bumpers
# (listeners of several workers) lock the same rows in the same order and cannot deadlock.
# The WHERE makes a bump that does not raise the tip a no-op (no new row version, no lock wait
# on a leased row beyond the statement).
BUMP = """
INSERT INTO projections_subscription
    (consumer, stream, source, lane, priority, at, tip, lease, retries, blocked, error, updated_at)
SELECT c, s, src, l, p, -1, t, 0, 0, false, '', now()
FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::int[], %s::bigint[]) AS b(c, s, src, l, p, t)
ORDER BY c, s
ON CONFLICT (consumer, stream) DO UPDATE SET tip = EXCLUDED.tip, updated_at = now()
WHERE projections_subscription.tip < EXCLUDED.tip
"""

# -- bump_hinted --
# The same upsert for tips that come from a notification. Any role that can connect may NOTIFY the
# channel, so a tip there is a hint: each is clamped to the stream's real last seq (one backward
# probe of the (stream_id, seq) unique index: the journal's STREAM_TIP_SQL hook; the notification is
# delivered after its commit, so this statement sees the events it announces), and a stream with no
# events subscribes nobody.
BUMP_HINTED = f"""
INSERT INTO projections_subscription
    (consumer, stream, source, lane, priority, at, tip, lease, retries, blocked, error, updated_at)
SELECT c, s, src, l, p, -1, LEAST(t, r.tip), 0, 0, false, '', now()
FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::int[], %s::bigint[]) AS b(c, s, src, l, p, t)
CROSS JOIN LATERAL ({STREAM_TIP_SQL.format(stream='b.s')}) r
WHERE r.tip IS NOT NULL
ORDER BY c, s
ON CONFLICT (consumer, stream) DO UPDATE SET tip = EXCLUDED.tip, updated_at = now()
WHERE projections_subscription.tip < EXCLUDED.tip
"""

SYNC_CONSUMER = """
UPDATE projections_subscription SET lane = %s, priority = %s
WHERE consumer = %s AND (lane <> %s OR priority <> %s)
"""

# -- claim --
# One statement picks and leases. The candidates come from the partial index projections_sub_work
# (tip > at AND NOT blocked): caught-up streams are never read, however many there are.
# FOR UPDATE SKIP LOCKED: a row another claimer (or an ack in flight) holds is skipped, never
# waited for, so workers never block each other and never get the same row.
# A live lease (leased_until in the future) excludes a row; so does a retry back-off.
# lease + 1 is the new fence token: an ack must bring it back.
# Order: priority first, then the row served longest ago (NULLs: never leased), for fairness.
CLAIM = """
WITH picked AS (
    SELECT id FROM projections_subscription
    WHERE tip > at AND NOT blocked AND lane = %(lane)s AND consumer = ANY(%(consumers)s)
      AND (leased_until IS NULL OR leased_until < clock_timestamp())
    ORDER BY priority DESC, leased_until NULLS FIRST, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE projections_subscription s
SET lease = s.lease + 1, leased_by = %(by)s,
    leased_until = clock_timestamp() + %(secs)s * interval '1 second'
FROM picked WHERE s.id = picked.id
RETURNING s.id, s.consumer, s.stream, s.at, s.tip, s.lease, s.retries
"""

# -- ack --
# The lease is the fence: the row changes only if this worker still holds the very lease it
# claimed (token and holder) and it has not expired by the database's clock at this moment
# (clock_timestamp(), not the transaction's start). A taken-over or expired lease acks nothing,
# and a projection's transaction then rolls back its read-model writes with it.
# Rows are locked in (consumer, stream) order first, like BUMP inserts them, so the two cannot
# deadlock.
# `at` is the last seq the claim READ (and delivered, or skipped as not followed): never the tip.
# `ended`: the read reached the end of the stream (fewer than batch rows), so no event lies between
# `at` and the tip the claim saw. If the tip is still the claim's (nothing raised it since: bumps
# only raise), that tip was never backed by an event (a forged notification, see listener.py) and
# comes down to the watermark, so the row stops being claimed; a real bump raises it again later.
ACK = """
WITH a AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(leases)s::bigint[], %(ats)s::bigint[], %(tips)s::bigint[],
                         %(ended)s::boolean[]) AS a(id, lease, at, tip, ended)
), locked AS (
    SELECT s.id FROM projections_subscription s JOIN a ON a.id = s.id
    ORDER BY s.consumer, s.stream
    FOR UPDATE OF s
)
UPDATE projections_subscription s
SET at = GREATEST(s.at, a.at),
    tip = CASE WHEN a.ended AND s.tip = a.tip THEN GREATEST(s.at, a.at) ELSE GREATEST(s.tip, a.at) END,
    retries = 0, error = '', leased_by = NULL, leased_until = NULL, updated_at = now()
FROM a, locked
WHERE s.id = a.id AND locked.id = a.id
  AND s.lease = a.lease AND s.leased_by = %(by)s AND s.leased_until >= clock_timestamp()
RETURNING s.id
"""

# -- fail / block --
# Same fence as ACK (token and holder). The row is released with a back-off (leased_until in the
# future, no holder) and blocked once its retries reach the limit; the error is kept for the admin.
# `at` records the events handled before the failing one (in the same transaction as their effects).
FAIL = """
UPDATE projections_subscription
SET at = GREATEST(at, %(at)s), tip = GREATEST(tip, %(at)s),
    retries = retries + 1, error = %(error)s, blocked = retries + 1 >= %(limit)s,
    leased_by = NULL, leased_until = clock_timestamp() + %(delay)s * interval '1 second', updated_at = now()
WHERE id = %(id)s AND lease = %(lease)s AND leased_by = %(by)s
RETURNING blocked
"""

RELEASE = """
UPDATE projections_subscription SET leased_by = NULL, leased_until = NULL
FROM unnest(%(ids)s::bigint[], %(leases)s::bigint[]) AS a(id, lease)
WHERE projections_subscription.id = a.id AND projections_subscription.lease = a.lease
  AND projections_subscription.leased_by = %(by)s
"""

UNBLOCK = """
UPDATE projections_subscription SET blocked = false, retries = 0, error = '', leased_until = NULL,
    updated_at = now()
WHERE id = ANY(%s)
"""

# -- reset --
# Replay: watermarks back to -1. lease + 1 voids every lease in flight (their acks then fail),
# so a worker mid-batch cannot re-advance a watermark past the replay.
RESET = """
UPDATE projections_subscription SET at = -1, retries = 0, blocked = false, error = '', lease = lease + 1,
    leased_by = NULL, leased_until = NULL, updated_at = now()
WHERE consumer = %s
"""


class PostgresProjectionStore(ProjectionStore):
    vendor = "postgresql"
    notifications = True

    def _cursor(self):
        return self.connection.cursor()

    def try_correlate_lock(self) -> bool:
        with self._cursor() as cursor:
            cursor.execute(CORRELATE_LOCK, [CORRELATE_LOCK_KEY])
            return bool(cursor.fetchone()[0])

    def checkpoints(self, consumers):
        with self._cursor() as cursor:
            cursor.execute(CHECKPOINTS, [list(consumers)])
            rows = [CheckpointRow(*row) for row in cursor.fetchall()]
            cursor.execute(CLOCK)
            return rows, Clock(*cursor.fetchone())

    def save_checkpoints(self, rows):
        if not rows:
            return
        with self._cursor() as cursor:
            cursor.execute(SAVE_CHECKPOINTS, [[r.consumer for r in rows], [r.position for r in rows],
                                              [r.horizon_id for r in rows], [r.horizon_at for r in rows],
                                              [r.horizon_xmax for r in rows]])

    def bump(self, bumps: Sequence[Bump], hinted: bool = False) -> int:
        if not bumps:
            return 0
        cols = list(zip(*sorted(bumps), strict=True))
        with self._cursor() as cursor:
            cursor.execute(BUMP_HINTED if hinted else BUMP, [list(c) for c in cols])
            return cursor.rowcount

    def sync_consumer(self, consumer, lane, priority):
        with self._cursor() as cursor:
            cursor.execute(SYNC_CONSUMER, [lane, priority, consumer, lane, priority])

    def claim(self, lane, consumers, by, limit, lease_seconds):
        with self._cursor() as cursor:
            cursor.execute(CLAIM, {"lane": lane, "consumers": list(consumers), "by": by, "limit": limit,
                                   "secs": lease_seconds})
            return [Claim.from_row(row) for row in cursor.fetchall()]

    def ack(self, acks, by, ended=frozenset()):
        if not acks:
            return set()
        ordered = sorted(acks, key=lambda a: (a[0].consumer, a[0].stream))
        with self._cursor() as cursor:
            cursor.execute(ACK, {"ids": [c.id for c, _ in ordered], "leases": [c.lease for c, _ in ordered],
                                 "ats": [at for _, at in ordered], "tips": [c.tip for c, _ in ordered],
                                 "ended": [c.id in ended for c, _ in ordered], "by": by})
            return {row[0] for row in cursor.fetchall()}

    def fail(self, claim, by, error, limit, delay, at=None):
        with self._cursor() as cursor:
            cursor.execute(FAIL, {"at": claim.at if at is None else at, "error": error, "limit": limit,
                                  "delay": delay, "id": claim.id,
                                  "lease": claim.lease, "by": by})
            row = cursor.fetchone()
        return None if row is None else bool(row[0])

    def release(self, claims, by):
        if not claims:
            return
        with self._cursor() as cursor:
            cursor.execute(RELEASE, {"ids": [c.id for c in claims], "leases": [c.lease for c in claims], "by": by})

    def unblock(self, ids):
        with self._cursor() as cursor:
            cursor.execute(UNBLOCK, [list(ids)])
            return cursor.rowcount

    def reset(self, consumer):
        with self._cursor() as cursor:
            cursor.execute(RESET, [consumer])
            return cursor.rowcount


