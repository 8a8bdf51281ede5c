"""What every lease store does. Items are (execution_id, fence_token) pairs; a batch names each
execution once. Every method is one statement per call (takeover: one short transaction)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.utils import timezone

from journal.flows.ownership import Companion
from journal.store.base import EXECUTION_STATUS_OF, DatabaseBound

Item = tuple[str, int]


@dataclass(frozen=True)
class Reservation:
    """The reservation of a queued start that has not begun: who may begin the execution `execution_id`."""

    execution_id: str
    flow: str
    input_hash: str
    started_by: str
    created_at: datetime

    def matches(self, flow: str, input_hash: str | Collection[str], started_by: str) -> bool:
        """Whether a start of (flow, input, starter) is the one this id was reserved for; `input_hash` is the
        input's hash, or its hashes under the current and the fallback secret keys."""
        hashes = {input_hash} if isinstance(input_hash, str) else set(input_hash)
        return self.flow == flow and self.input_hash in hashes and self.started_by == started_by


@dataclass(frozen=True)
class Takeover:
    """What one takeover transaction did: leases taken (with the advanced fence token) and
    executions given up on (marked stuck after LOOM_RECOVERY_MAX_ATTEMPTS recoveries)."""

    taken: list[Item] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    flow_of: dict[str, str] = field(default_factory=dict)  # the flow of each execution taken or stuck (logs)
    # The taken executions whose former owner handed the lease back at a step boundary (a graceful shutdown):
    # no recovery attempt, so their resume does not count one (leases/recovery.py resume_one).
    handed_back: list[str] = field(default_factory=list)


def split_stuck(candidates: Sequence[tuple[str, int, str]], claimed: dict[str, bool],
                max_attempts: int) -> tuple[list[str], list[str]]:
    """(stuck, retry) among the `claimed` candidates (id -> whether its lease was handed back): those recovered
    `max_attempts` times already give up, unless their lease was handed back at a step boundary (that takeover
    is no attempt: the run it continues was healthy when its worker stopped)."""
    recoveries = {eid: count for eid, count, _ in candidates}
    stuck = sorted(eid for eid, back in claimed.items() if recoveries[eid] >= max_attempts and not back)
    return stuck, sorted(set(claimed) - set(stuck))


# == schedules (leases/schedules.py): cron schedules ticked by the workers ============================


@dataclass(frozen=True, slots=True)
class DueSchedule:
    """A schedule whose next tick is due, as the tick's claim read it (under its lock)."""

    name: str
    cron: str
    flow: str
    input: object
    catch_up: str
    queue: str
    next_tick_at: datetime
    timezone: str = "UTC"  # the IANA zone the cron is evaluated in (its ticks are UTC instants all the same)


@dataclass(frozen=True, slots=True)
class ScheduleWrite:
    """What `save_schedule` writes: a validated definition (leases.schedules.define) and its first tick."""

    name: str
    cron: str
    flow: str
    input: str  # JSON text (journal.jsonvalues)
    catch_up: str
    queue: str
    enabled: bool
    source: str
    next_tick_at: datetime
    timezone: str = "UTC"  # an IANA name, validated (leases.schedules.parse_zone)


class ScheduleStatements(ABC):
    """The schedule part of every lease store (mixed into LeaseStore). The claim and the advance run
    in the CALLER's transaction (leases.schedules.tick): the starts of a tick, its advance and the
    release of the claim's lock commit together."""

    @abstractmethod
    def save_schedule(self, row: ScheduleWrite) -> None:
        """Insert or update the schedule named row.name. An update keeps the row's next tick (and its
        last tick) unless the cron or the time zone changed or a disabled schedule is enabled again:
        then the next tick is row.next_tick_at (missed ticks of a disabled schedule are not caught up)."""

    @abstractmethod
    def claim_due_schedules(self, limit: int, flows: Sequence[str] | None = None) -> tuple[datetime, list[DueSchedule]]:
        """(the database's now, the enabled schedules whose next tick is at or before it), at most
        `limit`, oldest tick first, locked until the caller's transaction ends; a schedule another
        ticker holds is passed over, never waited for. `flows`: only schedules of these flows (the ones
        this process can start; None: any). Must run inside a transaction."""

    @abstractmethod
    def advance_schedule(self, name: str, next_tick_at: datetime, last_tick_at: datetime | None,
                         last_execution_id: str | None) -> None:
        """Move the schedule's next tick (and its last tick, when one was started) in the caller's transaction."""

    def delete_schedules(self, prefix: str) -> int:
        """Delete the schedules whose name starts with `prefix` (benchmarks and tests: their own prefix)."""
        with self.connection.cursor() as cursor:
            cursor.execute(DELETE_SCHEDULES, [prefix + "%"])
            return cursor.rowcount


class LeaseStore(ScheduleStatements, DatabaseBound, ABC):
    #: The lease CTEs this backend adds to the flows' bootstrap and settle statements (inline leases,
    #: journal/flows/ownership.py), or None: its leases are written by the keeper only.
    companion: Companion | None = None

    def prepare_keeper_session(self) -> None:
        """Tune the keeper thread's own connection (once per connection); nothing by default."""
        return None

    @abstractmethod
    def acquire_many(self, owner: str, items: Sequence[Item], ttl: float, release: Sequence[Item] = (),
                     handed_back: bool = False) -> set[str]:
        """Lease each execution for `owner` at its fence token; return the ids acquired. The
        `release` items (none of them among `items`) are released in the same statement. handed_back=True
        (with a TTL of 0): a graceful hand-back of lazy claims that had no row yet (see expire_many).

        Refused (absent from the result): a lease held at a higher token, or at the same token by
        another owner, or a token that is not the execution's current fence (a stale run)."""

    @abstractmethod
    def renew_many(self, owner: str, items: Sequence[Item], ttl: float) -> set[str]:
        """Extend the leases `owner` still holds at these tokens; the ids missing were lost."""

    @abstractmethod
    def release_many(self, owner: str, items: Sequence[Item]) -> int:
        """Delete the leases `owner` holds at these tokens (a run settled); others are untouched."""

    @abstractmethod
    def expire_many(self, owner: str, items: Sequence[Item], graceful: bool = False) -> int:
        """Make the leases `owner` holds expire now (clean shutdown: the executions are still
        running and another worker's recovery sweep should take them over at once). graceful=True: their
        runs stopped at a step boundary (a graceful shutdown), so the row is marked handed back and the
        takeover that follows is no recovery attempt (Takeover.handed_back); False (a run cut off mid-step):
        its takeover counts, as after a crash."""

    @abstractmethod
    def takeover(self, owner: str, ttl: float, orphan_after: float, max_attempts: int, limit: int,
                 flows: Sequence[str | tuple[str, int]] | None = None,
                 orphan_window: float | None = None) -> Takeover:
        """Take the running executions whose lease expired (or that never had one for
        `orphan_after` seconds): the lease moves to `owner` and the fence advances in the same
        transaction; those recovered `max_attempts` times already are marked stuck instead (a recovery
        counts once its run reached the database: the journal's count_recovery, not this transaction),
        unless their lease was handed back gracefully (expire_many graceful=True): those are taken, listed
        in Takeover.handed_back, and their takeover counts no recovery.
        `flows`: only executions of these flows (the ones this worker can run; None: any): names (any
        version) or (name, version) pairs (journal.flows.registry.runnable(), journal.store.base.flow_keys).
        `orphan_window`: look for orphans only among the headers that passed `orphan_after` in the
        last `orphan_window` seconds (the common sweep: a long run's header stays old, so reading
        all old ones costs one read per long run); None: among all (the full orphan pass)."""

    def drop_lease(self, execution_id: str) -> int:
        """Delete the execution's lease row, whoever holds it: called in a cancel's transaction (its fence
        advance fenced every holder off, so the row is no one's; journal.flows.runtime.CANCEL_HOOKS)."""
        return self._count(DROP_LEASE, [execution_id])

    @abstractmethod
    def prune_settled_leases(self) -> int:
        """Delete the expired lease rows of executions no run can hold (settled or parked): what a release
        lost in a crash, or an acquire that raced a cancel, left behind (the recovery sweep reads running
        executions only, so nothing else would ever remove them); the number deleted."""

    @abstractmethod
    def touch_worker(self, worker_id: str, host: str, pid: int, role: str = "") -> None:
        """Register the node or mark it seen (one statement per heartbeat tick)."""

    @abstractmethod
    def prune_workers(self, older_than: float) -> int:
        """Delete the rows of workers not seen for `older_than` seconds that hold no lease (the
        workers page keeps what is alive or recently gone); the number deleted."""

    @abstractmethod
    def stop_worker(self, worker_id: str) -> None:
        """Mark the node stopped (clean shutdown)."""

    # -- start reservations (leases.StartReservation: a queued start's id, before its header exists) ------
    #: PRUNE_RESERVATIONS of the backend (it names the journal's EXECUTION_EXISTS hook of that backend).
    prune_reservations_sql = ""

    def reserve_start(self, execution_id: str, flow: str, input_hash: str,
                      started_by: str) -> tuple[bool, Reservation | None]:
        """Reserve `execution_id` for this start: (True, None) when reserved now; else (False, the
        reservation that holds it), or (False, None) when the one that held it is gone (its execution
        began: a worker releases a reservation only after the execution's header committed)."""
        if self._rows(RESERVE_START, [execution_id, flow, input_hash, started_by]):
            return True, None
        return False, self.reservation(execution_id)

    def reservation(self, execution_id: str) -> Reservation | None:
        """The reservation of `execution_id`, or None (never reserved, or its execution began)."""
        rows = self._rows(READ_RESERVATION, [execution_id])
        return self._reservation(rows[0]) if rows else None

    def release_reservation(self, execution_id: str) -> int:
        """Delete the reservation of an execution that now exists (its header holds the id from now on)."""
        return self._count(RELEASE_RESERVATION, [execution_id])

    def reserved_ids(self, limit: int) -> list[str]:
        """Up to `limit` reserved execution ids, oldest first: the sharded pruning looks each one's header up on
        its execution's shard, since no statement joins two databases (leases/tasks.py prune_reservations)."""
        return [row[0] for row in self._rows(RESERVED_IDS, [limit])]

    def prune_reservations(self) -> int:
        """Delete the reservations whose execution exists (a worker died between the execution's first write
        and its release); the number deleted."""
        return self._count(self.prune_reservations_sql, [])

    def _reservation(self, row: tuple) -> Reservation:
        return Reservation(*row)

    # -- benchmarks and tests only: counts and clean-up by execution id prefix --------------------------
    def count_leases(self, prefix: str) -> int:
        """Lease rows of the executions whose id starts with `prefix` (no join: a lease row may outlive
        its execution header)."""
        with self.connection.cursor() as cursor:
            cursor.execute(COUNT_LEASES, [prefix + "%"])
            return cursor.fetchone()[0]

    def fill_leases(self, owner: str, execution_ids: Sequence[str], token: int, expires_in: float) -> None:
        """Benchmarks only: a lease of `owner` at `token` on each execution, expiring `expires_in`
        seconds from now (negative: expired), bulk loaded (journal's bulk_load, this app's table)."""
        now = timezone.now()
        at = self.connection.ops.adapt_datetimefield_value
        acquired, expires = at(now), at(now + timedelta(seconds=expires_in))
        self.bulk_load(*FILL_LEASES, ((eid, owner, token, acquired, acquired, expires) for eid in execution_ids))
        self.analyze(FILL_LEASES[0])

    def delete_leases(self, prefix: str) -> int:
        """Delete the lease rows of the executions under `prefix` (maintenance of bench/test rows)."""
        return self._count(DELETE_LEASES, [prefix + "%"])

    def drop_removed(self, execution_ids: list[str], leases: bool = True, reservations: bool = True) -> int:
        """Retention (journal.retention.REMOVE_HOOKS, in the removal batch's transaction): the lease rows and
        start reservations of removed executions (under LOOM_SHARDS the reservations live on `default` only:
        journal.shards.UNSHARDED_MODELS); the number of rows deleted."""
        marks = ", ".join(["%s"] * len(execution_ids))
        chosen = [sql for sql, wanted in zip(DROP_REMOVED, (leases, reservations), strict=True) if wanted]
        return sum(self._count(sql.format(marks=marks), list(execution_ids)) for sql in chosen)


# -- drop_lease -- (a cancel, in its transaction)
# Every row of the execution, whatever its owner and token: the cancel advanced the fence before, so a
# holder's renewal finds nothing (it learns it lost) and its acquire is refused (ACQUIRE's current-fence
# join). No lock beyond the delete's own row lock (it waits for a renewal of the row in flight).
DROP_LEASE = "DELETE FROM leases_lease WHERE execution_id = %s"

# -- drop_removed -- (retention, in the removal batch's transaction) the rows of settled executions whose
# headers the batch locked: no run holds them (a settled execution's fence was moved by its settle), so the
# deletes' own row locks wait for nobody but a release of the same row in flight.
DROP_REMOVED = ("DELETE FROM leases_lease WHERE execution_id IN ({marks})",
                "DELETE FROM leases_startreservation WHERE execution_id IN ({marks})")

# -- prune_settled_leases -- (the recovery service, every PRUNE_EVERY seconds; each backend's clock)
# Expired rows only (the index on expires_at): a live row of a settled run is its owner's release in
# flight. The statuses in which no run holds an execution: settled, or parked (a waiting or suspended run
# let its lease go; its next run takes a new fence and a new lease). Not running (the recovery sweep's),
# not stuck (an operator's resume runs it under that status until it settles). The journal's
# EXECUTION_STATUS_OF hook: one primary-key probe per expired row, no lock.
PRUNABLE = "('completed', 'failed', 'cancelled', 'waiting', 'suspended')"
PRUNE_SETTLED_LEASES = (
    "DELETE FROM leases_lease WHERE expires_at < {now} AND "
    + EXECUTION_STATUS_OF.format(eid="leases_lease.execution_id") + " IN " + PRUNABLE
)

# -- count_leases / delete_leases -- (benchmarks, tests)
# -- fill_leases -- (benchmarks: the growth section's recovery sweep, through bulk_load)
FILL_LEASES = ("leases_lease", ("execution_id", "owner", "fence_token", "acquired_at", "renewed_at", "expires_at"))
COUNT_LEASES = "SELECT count(*) FROM leases_lease WHERE execution_id LIKE %s"
DELETE_LEASES = "DELETE FROM leases_lease WHERE execution_id LIKE %s"


# -- delete_schedules -- (benchmarks, tests: their own prefix)
DELETE_SCHEDULES = "DELETE FROM leases_schedule WHERE name LIKE %s"

# -- reserve_start --
# One insert that either reserves the id or does nothing: two concurrent starts of one id cannot both
# win. The loser's insert waits on the winner's uncommitted row (PostgreSQL: the primary key's unique
# check; SQLite: the write lock, BEGIN IMMEDIATE), then does nothing and returns no row; the caller's
# next statement (READ_RESERVATION, a new snapshot under READ COMMITTED) reads the row that won.
# created_at takes the column's database default (now).
RESERVE_START = """
INSERT INTO leases_startreservation (execution_id, flow, input_hash, started_by) VALUES (%s, %s, %s, %s)
ON CONFLICT (execution_id) DO NOTHING
RETURNING execution_id
"""

# -- read_reservation --
READ_RESERVATION = """
SELECT execution_id, flow, input_hash, started_by, created_at FROM leases_startreservation WHERE execution_id = %s
"""

# -- reserved_ids -- (no lock: a reservation deleted meanwhile is simply not released twice)
RESERVED_IDS = "SELECT execution_id FROM leases_startreservation ORDER BY created_at, execution_id LIMIT %s"

# -- release_reservation --
RELEASE_RESERVATION = "DELETE FROM leases_startreservation WHERE execution_id = %s"

# -- prune_reservations -- (each backend formats it with its journal store's EXECUTION_EXISTS hook)
PRUNE_RESERVATIONS = "DELETE FROM leases_startreservation WHERE {begun}"

