"""What every queue store does. One implementation per database backend (postgres.py, sqlite.py)
holds all the SQL of the queue tables, named, with the reason beside every lock.

The dequeue is one short transaction per queue that serialises the queue's claimers on its row, so
that "count what runs, then claim up to the cap" is atomic across every worker process and host.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from journal.store.base import EXECUTION_STATUS_OF, DatabaseBound
from queues.exceptions import QueueFull

# A started entry's execution whose header is in one of these states has finished: its slot is free.
# Not "stuck": recovery gave up on it, but an operator's resume runs it again under the same header
# status (it stays "stuck" until it settles), so it keeps its slot until it settles (review R2). A
# failed execution frees its slot; a retry takes it back (reopen, called from journal.flows.retry).
SETTLED = ("completed", "failed", "cancelled")


def not_begun(q: str, status: str) -> str:
    """SQL: the claimed entry `q`'s run has not begun (its claim may be offered again). A start entry: its
    execution is still queued (or, written before queued executions, has no header yet: NULL). A resume
    entry (a hand-over): its runner has not begun it (begun_at: its begin and the resume's takeover follow
    each other; a worker that dies between them leaves a running execution the recovery sweep takes over)."""
    return (f"(({q}.resume_fence IS NULL AND COALESCE({status}, 'queued') = 'queued')"
            f" OR ({q}.resume_fence IS NOT NULL AND {q}.begun_at IS NULL))")


def begun_late(x: str) -> str:
    """SQL: a start entry offered again whose first claimer began it late after all (its execution left
    `queued`): it is started again (counted). Never a resume entry (its execution runs before it began)."""
    return f"({x}.resume_fence IS NULL AND {x}.status IS NOT NULL AND {x}.status <> 'queued')"


#: A worker's flows filter (`ready_queues`, `next_due`, `dequeue`), shaped as the journal's stores take it
#: (journal.store.base.flow_keys): a flow name (any version) or a (name, version) pair; a worker passes
#: registry.runnable(). An entry matches by its execution's header's flow_version (the version it is pinned
#: to since its enqueue), so a worker never claims an execution of a version it lacks; an entry without a
#: header (written before queued executions) matches by its flow name.
Flows = Sequence[str | tuple[str, int]]


@dataclass(frozen=True, slots=True)
class NewEntry:
    """A start to queue, validated and encoded before any SQL (queues/enqueuing.py)."""

    queue: str
    execution_id: str
    flow: str
    input: str  # JSON text (journal/jsonvalues.py)
    meta: str  # JSON text or ""
    partition_key: str | None = None
    priority: int = 0
    dedup_id: str | None = None
    run_after: datetime | None = None  # None: now
    # The enqueuing process's declaration of the queue (concurrency, partition_concurrency, rate_limit,
    # rate_period): the row is created with it if it is missing, in the same statement or transaction.
    caps: tuple | None = None
    # A resume entry (journal.flows.hand_over): resume the execution from this fence token (else a start).
    resume_fence: int | None = None
    resume_force: bool = False


@dataclass(frozen=True, slots=True)
class Existing:
    """The live entry (or the entry of the same execution id) an enqueue found instead of inserting."""

    execution_id: str
    flow: str
    input: Any
    by_dedup: bool  # matched by its dedup id (else by execution id)


@dataclass(frozen=True, slots=True)
class Claimed:
    """An entry a worker claimed: run `flow(input)` as execution `execution_id`."""

    execution_id: str
    flow: str
    input: Any
    meta: dict | None
    attempts: int
    worker: str = ""  # who claimed it: the runner's begin is conditional on its own claim
    resume_fence: int | None = None  # a resume entry: resume from this fence (else: begin a start)
    resume_force: bool = False
    queue: str = ""  # the queue it was claimed from (the dispatch-lag histogram's label)
    lag: float | None = None  # seconds from when it was due (run_after) to its claim, on the database's clock


@dataclass(frozen=True, slots=True)
class QueueStats:
    """One queue as the admin and `manage.py loom queues` show it."""

    name: str
    concurrency: int
    partition_concurrency: int | None
    rate_limit: int | None
    rate_period: float | None
    pending: int  # waiting, including entries not due yet (run_after in the future)
    ready: int  # waiting and due
    running: int  # claimed, and their execution is running or has not begun yet


@dataclass(slots=True)
class Caps:
    """A queue's row, read under its lock by a dequeue."""

    concurrency: int
    partition_concurrency: int | None
    rate_limit: int | None
    rate_period: float | None
    running: dict[str | None, int] = field(default_factory=dict)  # per partition key (None: no key)

    @property
    def total(self) -> int:
        return sum(self.running.values())


def pick(caps: Caps, rows: Sequence[tuple[int, str | None]], want: int, taken: dict[str | None, int]) -> list[int]:
    """The candidate ids (in start order) that fit the per-partition cap, up to `want`; `taken` counts
    what this dequeue already picked per partition (updated)."""
    chosen: list[int] = []
    limit = caps.partition_concurrency
    for entry_id, key in rows:
        if len(chosen) >= want:
            break
        if limit is not None and key is not None and caps.running.get(key, 0) + taken.get(key, 0) >= limit:
            continue
        taken[key] = taken.get(key, 0) + 1
        chosen.append(entry_id)
    return chosen


def check_room(queue: str, key: str | None, caps: Caps) -> None:
    """QueueFull unless one more execution (of partition `key`) fits the caps counted under the lock."""

    if caps.total >= caps.concurrency:
        raise QueueFull(f"queue {queue!r} runs {caps.total} of its cap {caps.concurrency}; nothing written, "
                        f"retry once one of them has settled")
    limit = caps.partition_concurrency
    if limit is not None and key is not None and caps.running.get(key, 0) >= limit:
        raise QueueFull(f"partition {key!r} of queue {queue!r} runs {caps.running[key]} of its cap {limit}; "
                        f"nothing written, retry once one of them has settled")


def decode(text: str | None) -> Any:
    return None if not text else json.loads(text)


# -- oldest_due -- (the metrics page: per queue, the run_after of the oldest pending entry already due)
OLDEST_DUE = ("SELECT queue_id, min(run_after) FROM queues_entry WHERE state = 'pending' AND run_after <= %s "
              "GROUP BY queue_id")


class QueueStore(DatabaseBound, ABC):
    # Candidates read per page when a per-partition cap may skip some (keyset pages until enough fit).
    PAGE = 256
    #: Whether an entry made pending is notified on LOOM_QUEUE_CHANNEL (PostgreSQL's NOTIFY), so that a
    #: dispatcher may LISTEN instead of polling; without it every dispatcher polls (LOOM_QUEUE_POLL).
    notifications = False

    @abstractmethod
    def has_queue(self, name: str) -> bool:
        """Whether a row of that queue exists (declared by some process)."""

    @abstractmethod
    def upsert_queue(self, spec) -> None:
        """Write the queue's row with these caps (queues.declarations.QueueSpec), creating it if needed."""

    @abstractmethod
    def insert_entry(self, entry: NewEntry) -> Existing | None:
        """Queue a start; None when inserted. When a live entry (pending or started, whose execution has
        not settled) of the queue holds the dedup id, or any entry holds the execution id, nothing is
        written and that entry is returned. Racing inserts of one dedup id or execution id: one wins."""

    @abstractmethod
    def upsert_resume(self, entry: NewEntry) -> bool:
        """Queue a resume of an existing execution (entry.resume_fence set): its entry, if it has one, is
        pending again as a resume (in its own queue: the caller names it), else one is inserted. False
        (nothing written) when its entry is a pending start (the execution is queued: a worker begins it)."""

    @abstractmethod
    def ready_queues(self, flows: Flows, claim_timeout: float) -> list[str]:
        """Queues with an entry a worker with these flows could claim now: pending and due, or claimed
        longer than `claim_timeout` ago without its execution having begun (to be offered again)."""

    @abstractmethod
    def next_due(self, flows: Flows) -> float | None:
        """Seconds until the earliest entry of these flows deferred to a later time falls due (None: no
        such entry): how long a listening dispatcher may sleep at most."""

    @abstractmethod
    def dequeue(self, queue: str, owner: str, limit: int, flows: Flows,
                claim_timeout: float) -> list[Claimed] | None:
        """Claim up to `limit` entries of `queue` (of these flows) for `owner`, in priority then FIFO order,
        within every cap of the queue's row: running (claimed, execution not settled) below `concurrency`, per
        partition below `partition_concurrency`, and starts in the last `rate_period` seconds below
        `rate_limit`. In the same transaction, started entries whose execution settled become done, and
        claimed entries whose execution never began within `claim_timeout` are offered again. Serialised
        per queue across processes; None when another worker is claiming from the queue right now (try
        again shortly: it may leave slots free), [] when nothing can be claimed."""

    @abstractmethod
    def queue_stats(self) -> list[QueueStats]:
        """Every queue row with its depth and running count, by name."""

    def oldest_due(self, now: Any) -> dict[str, Any]:
        """queue -> the run_after of its oldest due pending entry (the metrics page's oldest pending age); no
        lock: a scrape reads a snapshot. `now`: the backend's parameter for the current time."""
        return dict(self._rows(OLDEST_DUE, [now]))

    @abstractmethod
    def prune_entries(self, older_than: float) -> int:
        """Delete done and cancelled entries that finished more than `older_than` seconds ago, and that
        started before their queue's rate window (the window counts them); the number deleted."""

    @abstractmethod
    def reopen(self, execution_id: str) -> bool:
        """A settled (done) entry's execution runs again (journal.flows.retry, in its transaction):
        the entry is started again, so the queue's caps count it. Under the queue's row lock, like a
        dequeue; QueueFull (nothing written) if the queue or the entry's partition is at its cap. False
        when the execution has no done entry (not queued, or already counted)."""

    @abstractmethod
    def cancel_pending(self, execution_id: str) -> bool:
        """Cancel an entry whose run has not begun: pending, or claimed by a worker whose runner has not
        begun it (begin then refuses it); under the entry's row lock. False when its run has begun, it
        has finished or it does not exist (then cancel the execution: journal.flows.cancel)."""

    @abstractmethod
    def set_priority(self, ids: Sequence[int], priority: int) -> list[int]:
        """An operator's reprioritise (the admin): the entries among `ids` still pending get `priority`
        (validated by the caller: -100..100); the ids changed. A started, done or cancelled entry is left
        as it is (its start order no longer matters), even one claimed while this statement waited."""

    @abstractmethod
    def begin(self, execution_id: str, worker: str, attempts: int) -> bool:
        """The claimer's runner is about to start the execution: True (and from now on cancel_pending
        refuses) if the entry is still this claim's (started by `worker` at claim number `attempts`,
        not begun); False when it was cancelled or offered again meanwhile: do not start it."""

    # -- pause / resume (queues/pause.py) ------------------------------------------------------------
    def pause_queue(self, name: str, by: str) -> bool | None:
        """Pause the queue's dispatch: True if paused now, False if it already was (kept as it was), None if
        the queue has no row here. The update waits for a dequeue holding the row (PostgreSQL: FOR UPDATE;
        SQLite: the write lock), so once this commits no dequeue claims from the queue until resume_queue."""
        if self._count(PAUSE_QUEUE, [self._now_param(), by, name]):
            return True
        return False if self._rows(HAS_QUEUE_ROW, [name]) else None

    def resume_queue(self, name: str) -> bool | None:
        """Resume it: True if it was paused, False if it was not, None if the queue has no row here."""
        if self._count(RESUME_QUEUE, [name]):
            return True
        return False if self._rows(HAS_QUEUE_ROW, [name]) else None

    def _now_param(self):
        """The current time as this backend's statements take it (a parameter, not the SQL's own clock)."""
        from django.utils import timezone

        return timezone.now()

    CANDIDATES = ""  # the backend's candidates statement (a keyset page; see postgres.py)

    def _candidates(self, caps: Caps, params: dict, want: int, start: tuple[int, int]) -> list[int]:
        """Ids to claim, in start order, that fit the per-partition cap: one page when there is no
        such cap (every candidate fits), else keyset pages until `want` fit or none is left."""
        chosen: list[int] = []
        taken: dict[str | None, int] = {}
        after = start
        page = want if caps.partition_concurrency is None else max(self.PAGE, want)
        while len(chosen) < want:
            rows = self._rows(self.CANDIDATES, {**params, "after_priority": after[0], "after_id": after[1],
                                                "page": page})
            if not rows:
                break
            chosen += pick(caps, [(r[0], r[1]) for r in rows], want - len(chosen), taken)
            if len(rows) < page:
                break
            after = (rows[-1][2], rows[-1][0])
        return chosen

    # -- benchmarks and tests only: counts and clean-up by execution id prefix ----------------------
    def count_entries(self, prefix: str, state: str) -> int:
        """Entries under `prefix` in `state`."""
        return self._rows(COUNT_ENTRIES, [prefix + "%", state])[0][0]

    def delete_entries(self, prefix: str) -> int:
        """Delete the entries under `prefix` (maintenance of bench/test rows)."""
        return self._count(DELETE_ENTRIES, [prefix + "%"])

    def running_by_partition(self, queue: str) -> dict[str | None, int]:
        """Executions of the queue's entries whose journal header says running, per partition key: what
        the benchmarks and tests sample, read from the headers rather than from the entries' states."""
        return dict(self._rows(RUNNING_BY_PARTITION, [queue]))

    def drop_removed(self, execution_ids: list[str]) -> int:
        """Retention (journal.retention.REMOVE_HOOKS, in the removal batch's transaction): every entry of the
        removed (settled) executions; the number deleted."""
        return self._count(DROP_REMOVED.format(marks=", ".join(["%s"] * len(execution_ids))), list(execution_ids))

    def delete_queue(self, name: str) -> int:
        """Delete a queue row and its entries (tests, benchmarks: their own queues only)."""
        self._count(DELETE_QUEUE_ENTRIES, [name])
        return self._count(DELETE_QUEUE, [name])


# -- running_by_partition -- (benchmarks, tests) every entry of the queue, whatever its state: a
# bug that marked a running execution's entry done would still be counted here.
RUNNING_BY_PARTITION = f"""
SELECT q.partition_key, count(*) FROM queues_entry q
WHERE q.queue_id = %s AND {EXECUTION_STATUS_OF.format(eid="q.execution_id")} = 'running'
GROUP BY q.partition_key
"""

# -- count_entries / delete_entries / delete_queue -- (benchmarks, tests)
COUNT_ENTRIES = "SELECT count(*) FROM queues_entry WHERE execution_id LIKE %s AND state = %s"
DELETE_ENTRIES = "DELETE FROM queues_entry WHERE execution_id LIKE %s"
DELETE_QUEUE_ENTRIES = "DELETE FROM queues_entry WHERE queue_id = %s"
DELETE_QUEUE = "DELETE FROM queues_queue WHERE name = %s"

# -- pause_queue / resume_queue -- An operator's pause: the row's paused_at, read by the dequeue under the
# queue's row lock (postgres.py LOCK_QUEUE). Only a queue not paused yet is updated: a second pause keeps
# who paused it first and since when. No other lock than the update's own row lock.
PAUSE_QUEUE = "UPDATE queues_queue SET paused_at = %s, paused_by = %s WHERE name = %s AND paused_at IS NULL"
RESUME_QUEUE = "UPDATE queues_queue SET paused_at = NULL, paused_by = '' WHERE name = %s AND paused_at IS NOT NULL"
HAS_QUEUE_ROW = "SELECT 1 FROM queues_queue WHERE name = %s"

# -- drop_removed -- (retention) the entries of settled executions past their retention: done or cancelled
# long before (a rate window is seconds to hours, a retention days), so no cap counts them any more.
DROP_REMOVED = "DELETE FROM queues_entry WHERE execution_id IN ({marks})"
