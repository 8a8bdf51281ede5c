"""Reactions and projections on SQLite: the same statements as on PostgreSQL, under the write lock.

SQLite has one writer at a time: every write here runs in an IMMEDIATE transaction (the project's
transaction_mode), so a claim's read-and-lease is as atomic as PostgreSQL's SKIP LOCKED claim and
concurrent claimers simply queue on the lock. Times are UTC text in Django's format, compared as
strings; they come from this host's clock (SQLite is single-host).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from journal.atomic import atomic
from journal.store.sqlite import STREAM_TIP_SQL
from projections.store.base import Bump, CheckpointRow, Claim, Clock, ProjectionStore

CHECKPOINTS = ("SELECT consumer, position, horizon_id, horizon_at FROM projections_checkpoint"
               " WHERE consumer IN ({marks})")

SAVE_CHECKPOINT = """
INSERT INTO projections_checkpoint (consumer, position, horizon_id, horizon_at, horizon_xmax, updated_at)
VALUES (%s, %s, %s, %s, NULL, %s)
ON CONFLICT (consumer) DO UPDATE SET position = excluded.position, horizon_id = excluded.horizon_id,
    horizon_at = excluded.horizon_at, horizon_xmax = NULL, updated_at = excluded.updated_at
"""

# -- bump -- (see postgres.BUMP: a bump that does not raise the tip changes nothing)
BUMP = """
INSERT INTO projections_subscription
    (consumer, stream, source, lane, priority, at, tip, lease, retries, blocked, error, updated_at)
VALUES {rows}
ON CONFLICT (consumer, stream) DO UPDATE SET tip = excluded.tip, updated_at = excluded.updated_at
WHERE projections_subscription.tip < excluded.tip
"""

# -- bump_hinted -- tips from a notification, clamped to the stream's real last seq (the journal's
# STREAM_TIP_SQL hook; see postgres.BUMP_HINTED).
# MIN(t, NULL) is NULL in SQLite: a stream with no events subscribes nobody. The WHERE also lets
# SQLite parse the upsert clause after a SELECT.
BUMP_HINTED = f"""
WITH b(c, s, src, l, p, t, u) AS (VALUES {{rows}})
INSERT INTO projections_subscription
    (consumer, stream, source, lane, priority, at, tip, lease, retries, blocked, error, updated_at)
SELECT c, s, src, l, p, -1, MIN(t, ({STREAM_TIP_SQL.format(stream='b.s')})) AS real_tip,
    0, 0, 0, '', u
FROM b WHERE real_tip IS NOT NULL
ON CONFLICT (consumer, stream) DO UPDATE SET tip = excluded.tip, updated_at = excluded.updated_at
WHERE projections_subscription.tip < excluded.tip
"""

SYNC_CONSUMER = """
UPDATE projections_subscription SET lane = %s, priority = %s
WHERE consumer = %s AND (lane <> %s OR priority <> %s)
"""

# -- claim --
# One UPDATE ... RETURNING: the subquery's candidates come from the partial index
# projections_sub_work (tip > at AND NOT blocked), and the write lock taken at BEGIN IMMEDIATE
# means no other claimer can see the same rows before this one's lease is committed.
CLAIM = """
UPDATE projections_subscription SET lease = lease + 1, leased_by = %s, leased_until = %s
WHERE id IN (
    SELECT id FROM projections_subscription
    -- Spelled as the partial index's own predicate ("blocked" = 0 AND "tip" > "at"): SQLite uses a
    -- partial index only when the WHERE implies it term by term, and `NOT blocked` does not (it
    -- scanned every subscription: 5.3x the cost at 10^5 subscriptions than at 10^4, issue 16 growth).
    WHERE blocked = 0 AND tip > at AND lane = %s AND consumer IN ({marks})
      AND (leased_until IS NULL OR leased_until < %s)
    ORDER BY priority DESC, leased_until, id
    LIMIT %s
)
RETURNING id, consumer, stream, at, tip, lease, retries
"""

# -- ack -- the lease is the fence: holder, token and an unexpired window; `at` is the last seq read,
# and a tip no event backs comes down when the read reached the end of the stream (see postgres.ACK).
# SET expressions all see the row as it was before the update.
ACK = """
UPDATE projections_subscription
SET at = MAX(at, %s), tip = CASE WHEN %s AND tip = %s THEN MAX(at, %s) ELSE MAX(tip, %s) END,
    retries = 0, error = '', leased_by = NULL, leased_until = NULL, updated_at = %s
WHERE id = %s AND lease = %s AND leased_by = %s AND leased_until >= %s
"""

FAIL = """
UPDATE projections_subscription
SET at = MAX(at, %s), tip = MAX(tip, %s), retries = retries + 1, error = %s,
    blocked = (retries + 1 >= %s), leased_by = NULL, leased_until = %s,
    updated_at = %s
WHERE id = %s AND lease = %s AND leased_by = %s
RETURNING blocked
"""

RELEASE = ("UPDATE projections_subscription SET leased_by = NULL, leased_until = NULL"
           " WHERE id = %s AND lease = %s AND leased_by = %s")

UNBLOCK = ("UPDATE projections_subscription SET blocked = 0, retries = 0, error = '', leased_until = NULL"
           " WHERE id IN ({marks})")

# -- reset -- lease + 1 voids leases in flight (see postgres.RESET).
RESET = """
UPDATE projections_subscription SET at = -1, retries = 0, blocked = 0, error = '', lease = lease + 1,
    leased_by = NULL, leased_until = NULL
WHERE consumer = %s
"""


def _text(value: datetime) -> str:
    """Django's SQLite datetime format (naive UTC), always with microseconds so text order is time order."""
    return value.astimezone(UTC).replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")


def _parse(value) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value if value is None or value.tzinfo else value.replace(tzinfo=UTC)
    return datetime.fromisoformat(value).replace(tzinfo=UTC)


class SqliteProjectionStore(ProjectionStore):
    vendor = "sqlite"

    @staticmethod
    def _now() -> datetime:
        return datetime.now(UTC)

    def try_correlate_lock(self) -> bool:
        return True  # the caller's IMMEDIATE transaction already holds the only write lock

    def checkpoints(self, consumers):
        names = list(consumers)
        if not names:
            return [], Clock(self._now())
        with self.connection.cursor() as cursor:
            cursor.execute(CHECKPOINTS.format(marks=", ".join(["%s"] * len(names))), names)
            rows = [CheckpointRow(r[0], r[1], r[2], _parse(r[3])) for r in cursor.fetchall()]
        return rows, Clock(self._now())

    def save_checkpoints(self, rows):
        now = _text(self._now())
        with self.connection.cursor() as cursor:
            for r in rows:
                cursor.execute(SAVE_CHECKPOINT, [r.consumer, r.position, r.horizon_id,
                                                 None if r.horizon_at is None else _text(r.horizon_at), now])

    def bump(self, bumps: Sequence[Bump], hinted: bool = False) -> int:
        if not bumps:
            return 0
        now = _text(self._now())
        changed = 0
        row = "(%s, %s, %s, %s, %s, %s, %s)" if hinted else "(%s, %s, %s, %s, %s, -1, %s, 0, 0, 0, '', %s)"
        sql = BUMP_HINTED if hinted else BUMP
        with atomic(self.alias), self.connection.cursor() as cursor:
            for start in range(0, len(bumps), 500):  # 7 parameters a row, SQLite allows 32766
                chunk = sorted(bumps)[start:start + 500]
                cursor.execute(sql.format(rows=", ".join([row] * len(chunk))), [v for b in chunk for v in (*b, now)])
                changed += cursor.rowcount
        return changed

    def sync_consumer(self, consumer, lane, priority):
        with self.connection.cursor() as cursor:
            cursor.execute(SYNC_CONSUMER, [lane, priority, consumer, lane, priority])

    def claim(self, lane, consumers, by, limit, lease_seconds):
        names = list(consumers)
        if not names:
            return []
        now = self._now()
        until = _text(now + timedelta(seconds=lease_seconds))
        sql = CLAIM.format(marks=", ".join(["%s"] * len(names)))
        with atomic(self.alias), self.connection.cursor() as cursor:
            cursor.execute(sql, [by, until, lane, *names, _text(now), limit])
            return [Claim.from_row(row) for row in cursor.fetchall()]

    def ack(self, acks, by, ended=frozenset()):
        done: set[int] = set()
        if not acks:
            return done
        now = _text(self._now())
        with atomic(self.alias), self.connection.cursor() as cursor:
            for claim, at in acks:
                cursor.execute(ACK, [at, claim.id in ended, claim.tip, at, at, now, claim.id, claim.lease, by, now])
                if cursor.rowcount:
                    done.add(claim.id)
        return done

    def fail(self, claim, by, error, limit, delay, at=None):
        now = self._now()
        at = claim.at if at is None else at
        with atomic(self.alias), self.connection.cursor() as cursor:
            cursor.execute(FAIL, [at, at, error, limit, _text(now + timedelta(seconds=delay)), _text(now), claim.id,
                                  claim.lease, by])
            row = cursor.fetchone()
        return None if row is None else bool(row[0])

    def release(self, claims, by):
        with atomic(self.alias), self.connection.cursor() as cursor:
            for c in claims:
                cursor.execute(RELEASE, [c.id, c.lease, by])

    def unblock(self, ids):
        ids = list(ids)
        if not ids:
            return 0
        with self.connection.cursor() as cursor:
            cursor.execute(UNBLOCK.format(marks=", ".join(["%s"] * len(ids))), ids)
            return cursor.rowcount

    def reset(self, consumer):
        with self.connection.cursor() as cursor:
            cursor.execute(RESET, [consumer])
            return cursor.rowcount
