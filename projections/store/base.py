"""What each backend's projection store does; the value objects it returns."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime

from journal.envelopes import StoredEvent
from journal.store import store_for as journal_store
from journal.store.base import DatabaseBound


@dataclass(frozen=True, slots=True)
class Claim:
    """One subscription leased to a worker. `lease` is the fence token its ack and block must carry."""

    id: int
    consumer: str
    stream: str
    at: int
    tip: int
    lease: int
    retries: int

    @classmethod
    def from_row(cls, row: tuple) -> Claim:
        return cls(*row)


@dataclass(frozen=True, slots=True)
class ScannedEvent:
    """An event as correlation sees it: enough to route it, no payload."""

    id: int
    stream_id: str
    seq: int
    type: str


@dataclass(frozen=True, slots=True)
class CheckpointRow:
    consumer: str
    position: int
    horizon_id: int
    horizon_at: datetime | None
    # PostgreSQL: the snapshot's xmax recorded once the horizon had aged: every transaction that
    # could still hold a missing id up to horizon_id has a smaller xid (see correlate.settle).
    horizon_xmax: int | None = None


@dataclass(frozen=True, slots=True)
class Clock:
    """The database's clock and, on PostgreSQL, its transactions when correlation starts a scan.

    xmax: the first xid not yet assigned. oldest: the oldest xid still running in another session
    (xmax if none). None on SQLite, where ids are assigned and committed under one write lock."""

    now: datetime
    xmax: int | None = None
    oldest: int | None = None


# A bump: (consumer, stream, source, lane, priority, seq) -> the subscription's tip is at least seq.
Bump = tuple[str, str, str, str, int, int]


# -- lag_by_consumer -- (the metrics page: per consumer, events its subscriptions know of and have not handled,
# and how many of them are blocked; no lock: a scrape reads a snapshot)
LAG_BY_CONSUMER = ("SELECT consumer, sum(CASE WHEN tip > at THEN tip - at ELSE 0 END), "
                   "sum(CASE WHEN blocked THEN 1 ELSE 0 END) FROM projections_subscription GROUP BY consumer")


class ProjectionStore(DatabaseBound, ABC):
    def lag_by_consumer(self) -> list[tuple[str, int, int]]:
        """(consumer, events behind, blocked subscriptions) of every consumer with subscriptions here."""
        return [(consumer, int(behind or 0), int(blocked or 0)) for consumer, behind, blocked
                in self._rows(LAG_BY_CONSUMER, [])]

    #: Whether this backend's journal notifies commits (PostgreSQL NOTIFY), so a listener can wake the
    #: lanes (projections/listener.py); without it the lanes poll.
    notifications = False

    # -- correlate --------------------------------------------------------------------------------
    @abstractmethod
    def try_correlate_lock(self) -> bool:
        """Inside a transaction: True if this worker may scan now (one scanner at a time)."""

    @abstractmethod
    def checkpoints(self, consumers: Sequence[str]) -> tuple[list[CheckpointRow], Clock]:
        """The consumers' checkpoints (missing ones absent) and the database's clock, read before
        the scan (so the scan's snapshot is later than the clock's)."""

    @abstractmethod
    def save_checkpoints(self, rows: Sequence[CheckpointRow]) -> None: ...

    def scan(self, after_id: int, limit: int) -> list[ScannedEvent]:
        """Events with id > after_id, in id order (committed ones only: what this snapshot sees).
        The journal's statement (scan_events), on this store's connection and transaction."""
        return [ScannedEvent(*row) for row in journal_store(self.alias).scan_events(after_id, limit)]

    @abstractmethod
    def bump(self, bumps: Sequence[Bump], hinted: bool = False) -> int:
        """Subscribe (consumer, stream) pairs and raise their tips; returns rows changed.

        hinted: the tips come from a notification (anyone may send one): each is clamped to the
        stream's real last seq, and streams without events are not subscribed."""

    @abstractmethod
    def sync_consumer(self, consumer: str, lane: str, priority: int) -> None:
        """Move a consumer's existing subscriptions to its declared lane and priority."""

    # -- drain ------------------------------------------------------------------------------------
    @abstractmethod
    def claim(self, lane: str, consumers: Sequence[str], by: str, limit: int, lease_seconds: float) -> list[Claim]:
        """Lease up to `limit` subscriptions of the lane that have work and no live lease."""

    def read(self, claims: Sequence[Claim], batch: int) -> dict[int, list[StoredEvent]]:
        """For each claim (by id), up to `batch` events of its stream after ITS OWN watermark.

        Never from another claim's watermark: what a claim is acked for must be what it read. Per
        distinct (stream, watermark) pair: consumers at the same watermark share one read (the
        journal's read_after, one round trip on PostgreSQL)."""
        found = journal_store(self.alias).read_after([(c.stream, c.at) for c in claims], batch)
        return {c.id: found[(c.stream, c.at)] for c in claims}

    @abstractmethod
    def ack(self, acks: Sequence[tuple[Claim, int]], by: str, ended: Collection[int] = frozenset()) -> set[int]:
        """Advance watermarks to the last seq each claim read and release leases, only where `by`
        still holds the claim's lease and it has not expired. Returns the ids acked; the others
        were taken over. `ended`: ids of claims whose read reached the end of the stream; a tip
        no event backs (unchanged since the claim) comes down to the watermark."""

    @abstractmethod
    def fail(self, claim: Claim, by: str, error: str, limit: int, delay: float, at: int | None = None) -> bool | None:
        """Count a failure, move the watermark to `at` (events handled before the failing one), block
        at `limit`, release with a back-off. Returns blocked, or None if the lease was lost."""

    @abstractmethod
    def release(self, claims: Sequence[Claim], by: str) -> None:
        """Give leases back without progress (a stopping worker)."""

    @abstractmethod
    def unblock(self, ids: Sequence[int]) -> int: ...

    @abstractmethod
    def reset(self, consumer: str) -> int:
        """Replay from the start: every watermark of the consumer back to -1."""

    # -- benchmarks and tests only -----------------------------------------------------------------
    def insert_caught_up(self, rows: Sequence[tuple[str, str, str, int, int, int]]) -> None:
        """Insert subscriptions as they are (consumer, stream, lane, priority, at, tip), no source, no
        lease: a benchmark's many caught-up rows without writing their events. Rows must be new."""
        with self.connection.cursor() as cursor:
            for start in range(0, len(rows), 2000):
                chunk = rows[start:start + 2000]
                cursor.execute(INSERT_SUBSCRIPTIONS.format(rows=", ".join([INSERT_SUBSCRIPTION_ROW] * len(chunk))),
                               [v for r in chunk for v in r])


    def analyze_subscriptions(self) -> None:
        """Refresh the planner's statistics of the subscriptions after a bulk insert (benchmarks)."""
        self.analyze("projections_subscription")

    def delete_consumer(self, consumer: str) -> int:
        """Delete every subscription of `consumer` (maintenance of a benchmark's own rows)."""
        with self.connection.cursor() as cursor:
            cursor.execute(DELETE_CONSUMER, [consumer])
            return cursor.rowcount


# -- delete_consumer -- (benchmarks, tests)
DELETE_CONSUMER = "DELETE FROM projections_subscription WHERE consumer = %s"

# -- insert_caught_up -- (benchmarks, tests)
INSERT_SUBSCRIPTIONS = """
INSERT INTO projections_subscription (consumer, stream, source, lane, priority, at, tip, lease, retries, blocked,
    error, updated_at) VALUES {rows}
"""
INSERT_SUBSCRIPTION_ROW = "(%s, %s, '', %s, %s, %s, %s, 0, 0, false, '', CURRENT_TIMESTAMP)"
