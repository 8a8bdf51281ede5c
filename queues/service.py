"""The queue dispatcher of a loom_worker: claims queued starts within their queues' caps and runs
them in a small thread pool of this process, and those of `async def` flows on its event loop
(queues/loop.py: LOOM_QUEUE_ASYNC_RUNS at once, besides the LOOM_QUEUE_THREADS threads).

One dispatcher thread per worker process looks for work at once when a run ends, when its last pass
claimed something, and, on PostgreSQL, when an entry is enqueued or offered again (a listener thread
per database LISTENs on LOOM_QUEUE_CHANNEL, which the store notifies in the enqueue's own statement).
Otherwise it sleeps LOOM_QUEUE_POLL seconds, or LOOM_QUEUE_IDLE_POLL when no queue has due work and
every listener is subscribed (no longer than until the next deferred entry falls due). Each pass asks
which queues have work it could claim (of the (flow, version) pairs registered here: an execution runs
only on the version it is pinned to, docs/flows.md "Versions and deploys"), and for each claims at most
as many entries as it has free slots: free threads for the sync flows' entries, free loop slots for the async
flows' (one pass per lane, each dequeue filtered on its lane's flows). Every cap is decided by the store's
dequeue, serialised per queue in the database, never here: this process's memory holds only how many of its
own slots are free.

A run begins the queued execution written at enqueue (journal.flows.queued.run_queued), with a lease
like any run: if this process dies, its executions are running executions whose leases expire, and any
worker's recovery sweep takes them over (they keep their queue slot until they settle). A claim whose
execution never began (still queued) is offered again after LOOM_QUEUE_CLAIM_TIMEOUT.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connections, router

from journal import shards, telemetry
from journal.flows import ExecutionExists, FlowError, NotResumable, OwnershipLost, aio, registry, resume, start
from journal.flows.interrupt import abandoned_threads
from journal.flows.queued import ELSEWHERE, LEGACY, NOT_HELD, run_queued, runs_here
from journal.identity import node_identity
from journal.listen import listen, polls_without_direct
from leases.worker import wait_until
from queues import conf, loop
from queues.declarations import write_declared
from queues.models import QueueEntry
from queues.store import store_for

log = logging.getLogger("loom.queues")
TASKS_BACKENDS = ("queues.tasks.LoomBackend", "journal.tasks.LoomBackend")  # the new path, the deprecated one
BUSY_RETRY = 0.005  # seconds before looking again at a queue another worker was claiming from
PRUNE_EVERY = 60.0  # seconds between two prunings of finished entries by one worker


_worker_id: str | None = None  # the worker id of this process's dispatcher (a label for results)


def worker_id() -> str | None:
    """The id of the loom_worker whose dispatcher runs in this process (None: none does)."""
    return _worker_id


def import_task_flows() -> None:
    """Register the Tasks backend's flow in this process when a TASKS backend is Loom's (a worker must
    know the flow of the entries it claims)."""
    backends = getattr(settings, "TASKS", None) or {}
    if any(isinstance(cfg, dict) and cfg.get("BACKEND") in TASKS_BACKENDS for cfg in backends.values()):
        import queues.tasks  # noqa: F401


@telemetry.traced_dispatch  # a span `loom.queue.dispatch` around the run when tracing is on
def run_claimed(claimed, using: str | None = None) -> str:
    """Run one claimed entry to its end in this thread; its status (or "cancelled": cancelled before it
    began, or no longer this claim's; "duplicate": its execution was no longer queued, begun by another
    claim or settled; "elsewhere": its flow version is not registered here; "halted", "error", "refused").

    A start entry begins its queued execution (journal.flows.queued.run_queued: the entry's begin, the
    header's lock, the fence advanced from the enqueue's and status running, in one transaction), then the
    flow runs from its log. An entry written before queued executions (no header; its input in the row)
    runs once the old way. A resume entry (a hand-over) resumes from its fence. Either runs the flow version
    the execution is pinned to (its header's): the dispatcher claims only entries of the (flow, version)
    pairs registered here; should one be claimed by a process without it (a race with a deploy), nothing is
    run or changed, not even the begin ("elsewhere"), and the claim is offered again after
    LOOM_QUEUE_CLAIM_TIMEOUT to a worker that has it. Nothing from the row is imported or unpickled.
    (An entry of an `async def` flow in a worker: `arun_claimed`, the same begin, the run from the loop.)"""

    began = time.monotonic()
    try:
        outcome = _run_entry(claimed, using)
    except Exception as exc:
        return _failed(claimed, began, exc)
    return _status(claimed, began, outcome)


@loop.traced_dispatch  # the same `loom.queue.dispatch` span around the whole run when tracing is on
async def arun_claimed(claimed, using: str | None = None) -> str:
    """run_claimed from the event loop (a worker's loop lane, queues/loop.py): the same begin in a thread of the
    journal's async pool (the claim check, the header's lock and fence: `_run_entry`, exactly as on a runner
    thread), then an `async def` flow's run driven on the loop by Runner.adrive (journal/flows/aio.py), each
    journal call in a pool thread, its short sleeps holding none; the same statuses and log lines. A sync flow's
    run (a hand-over of one) stays in the pool thread that began it."""
    began = time.monotonic()
    try:
        outcome, taken = await aio.begin_driven(_run_entry, claimed, using)
    except Exception as exc:
        return _failed(claimed, began, exc)
    if taken is not None:
        try:
            outcome = await aio.drive_handed(taken)
        except Exception as exc:
            if claimed.resume_fence is not None and isinstance(exc, FlowError):  # as resume() raising it
                _refused(claimed, exc)
                return "refused"
            return _failed(claimed, began, exc)
    return _status(claimed, began, outcome)


_REFUSED = object()  # _run_entry's outcome for a handed-over resume that resume() refused (logged)


def _run_entry(claimed, using: str | None) -> Any:
    """The run of one claimed entry in this thread: its Outcome, a string for what ran nothing (ELSEWHERE,
    NOT_HELD, the header's status), _REFUSED, or aio.HANDED_BACK (an async run left for arun_claimed to drive:
    its begin committed)."""
    store = store_for(using or router.db_for_write(QueueEntry))
    eid, flow = claimed.execution_id, claimed.flow

    def claim_holds() -> bool:
        # Begin only if the claim still stands (review R4): a cancel that came first wins, and from here on
        # a cancel of the entry is refused (the execution's own cancel applies).
        return store.begin(eid, claimed.worker, claimed.attempts)

    if claimed.resume_fence is not None:
        if not runs_here(eid, flow):  # before the begin: a worker without its version changes nothing
            return ELSEWHERE
        if not claim_holds():
            return NOT_HELD
        log.info("resume execution=%s flow=%s fence=%s (handed over, queued)", eid, flow, claimed.resume_fence)
        try:
            return resume(eid, force=claimed.resume_force, expected_fence=claimed.resume_fence)
        except (NotResumable, FlowError) as exc:
            _refused(claimed, exc)
            return _REFUSED
    outcome = run_queued(eid, flow, claim_holds)
    if outcome == LEGACY:  # an entry written before queued executions: its input is in the row
        log.info("start execution=%s flow=%s attempt=%d (queued, old entry)", eid, flow, claimed.attempts)
        outcome = start(flow, claimed.input, execution_id=eid, meta=claimed.meta)
    return outcome


def _refused(claimed, exc: Exception) -> None:
    log.warning("handed-over resume of %s (fence %s) not run: %s", claimed.execution_id, claimed.resume_fence, exc)


def _failed(claimed, began: float, exc: Exception) -> str:
    """The status of a run that raised."""
    eid, flow = claimed.execution_id, claimed.flow
    if isinstance(exc, ExecutionExists):
        log.info("duplicate execution=%s flow=%s: already %s, nothing to do", eid, flow, exc.status)
        return "duplicate"
    if isinstance(exc, OwnershipLost):
        log.warning("halted execution=%s flow=%s: %s", eid, flow, exc)
        return "halted"
    log.error("error execution=%s flow=%s duration=%.3fs", eid, flow, time.monotonic() - began, exc_info=exc)
    return "error"


def _status(claimed, began: float, outcome: Any) -> str:
    """The status of a run that returned (logged as its end)."""
    eid, flow = claimed.execution_id, claimed.flow
    if outcome is _REFUSED:
        return "refused"
    if outcome == ELSEWHERE:
        log.warning("not started execution=%s flow=%s: its flow version is not registered in this process; its "
                    "claim is offered again after the claim timeout", eid, flow)
        return "elsewhere"
    if outcome in (NOT_HELD, "cancelled"):  # not this claim's any more, or the execution was cancelled
        log.info("not started execution=%s flow=%s: cancelled or offered again since the claim", eid, flow)
        return "cancelled"
    if isinstance(outcome, str):
        log.info("duplicate execution=%s flow=%s: already %s, nothing to do", eid, flow, outcome)
        return "duplicate"
    level = logging.WARNING if outcome.status == "failed" else logging.INFO
    log.log(level, "%s execution=%s flow=%s attempt=%d duration=%.3fs", outcome.status, eid, flow, claimed.attempts,
            time.monotonic() - began)
    return outcome.status


def run_due(limit: int = 100, owner: str | None = None) -> list[str]:
    """Claim due entries of the flow versions registered here, within every queue's caps, and run each in THIS
    thread (tests, an embedding, a cron, the minute backstop of a qcluster-only deployment); a loom_worker's
    dispatcher does the same in a pool. Every shard; up to `limit` runs in all. The statuses, in order."""

    flows = registry.runnable()  # (flow, version) pairs: only entries of the versions this process has
    owner = owner or node_identity()
    done: list[str] = []
    timeout = conf.claim_timeout()
    for alias in shards.shards() if shards.sharded() else [router.db_for_write(_entry_model())]:
        store = store_for(alias)
        while flows and len(done) < limit:
            claimed = []
            for name in store.ready_queues(flows, timeout):
                claimed += store.dequeue(name, owner, limit - len(done) - len(claimed), flows, timeout) or []
            if not claimed:
                break
            done += [run_claimed(entry, alias) for entry in claimed]
    return done


def _entry_model():
    return QueueEntry


class Runners:
    """The runner threads of one dispatcher (a fixed pool). Each keeps its database connections from one
    run to the next (a run's statements reuse them) and closes them when it leaves: a ThreadPoolExecutor's
    threads would end (or idle on) with their sessions open, one per thread, until collected.

    stop() tells every thread to leave after its current run; the idle ones leave at once, closing their
    sessions, and are waited for. A thread in a run is not: the run stops at its next step once the
    heartbeat hands its lease back (that service stops after the dispatcher), and the thread then closes
    its sessions and leaves. A task handed over after stop() is dropped, not begun (its claim is offered
    again after LOOM_QUEUE_CLAIM_TIMEOUT)."""

    def __init__(self, size: int) -> None:
        self.tasks: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.busy: set[threading.Thread] = set()
        self.threads = [threading.Thread(target=self._loop, name=f"loom-queue-run-{n}", daemon=True)
                        for n in range(size)]
        for thread in self.threads:
            thread.start()

    def submit(self, task: Callable[[], None]) -> None:
        self.tasks.put(task)

    def _loop(self) -> None:
        me = threading.current_thread()
        try:
            while (task := self.tasks.get()) is not None:
                if self.stopping.is_set():
                    continue  # handed over too late: not begun, offered again after the claim timeout
                with self.lock:
                    self.busy.add(me)
                try:
                    task()
                except BaseException:  # SystemExit or CancelledError from a flow: the thread (its slot) stays
                    log.exception("queue runner: a task failed")
                finally:
                    with self.lock:
                        self.busy.discard(me)
        finally:
            connections.close_all()  # this thread's sessions, on every database it used

    def wait_idle(self, deadline: float) -> bool:
        """A graceful shutdown: wait until no thread is in a run (each run stops at its next step boundary,
        handing its lease back), or the monotonic `deadline`; True if none is."""

        return wait_until(lambda: not (self.busy - abandoned_threads()), deadline)  # an abandoned step: not waited

    def stop(self, timeout: float) -> None:
        """Every thread leaves after its current run (closing its sessions); wait up to `timeout` seconds
        for those not in a run."""
        self.stopping.set()
        for _ in self.threads:
            self.tasks.put(None)
        deadline = time.monotonic() + timeout
        with self.lock:
            idle = [thread for thread in self.threads if thread not in self.busy]
        for thread in idle:
            thread.join(max(0.0, deadline - time.monotonic()))


class Lane:
    """One kind of slot a dispatcher claims for: the runner threads (LOOM_QUEUE_THREADS: sync flows, and async
    ones when there is no loop lane) or the loop lane (LOOM_QUEUE_ASYNC_RUNS runs of `async def` flows on the
    event loop, queues/loop.py). A pass claims at most `free` entries for a lane, of its flows only (the
    dequeue filters on them), so an async run never waits for a runner thread nor takes its slot."""

    __slots__ = ("free", "name", "runs_async", "submit")

    def __init__(self, name: str, free: int, runs_async: bool | None, submit: Callable) -> None:
        self.name, self.free, self.submit = name, free, submit
        self.runs_async = runs_async  # True: async flows only; False: sync only; None: every flow

    def flows(self, runnable: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """The (flow, version) pairs of `runnable` this lane runs (a flow registered sync stays on threads)."""
        if self.runs_async is None:
            return runnable
        return [pair for pair in runnable if aio.is_async(registry.get_flow(*pair).fn) == self.runs_async]


class QueueService:
    """The worker service (leases.worker.register_service): dispatcher thread + runner pool + loop lane.

    With LOOM_SHARDS one dispatcher serves every shard: each pass claims from each shard's queues in turn
    (an entry lives on its execution's shard, docs/queues.md), with one pool of runner threads; a shard
    that is down is skipped, logged, and asked again next pass. Entries of `async def` flows are claimed for
    the loop lane (LOOM_QUEUE_ASYNC_RUNS, queues/loop.py) and run on the process's event loop."""

    name = "queue-dispatcher"

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self.wake = threading.Event()
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.pool: Runners | None = None
        self.loop_runs: loop.LoopRuns | None = None
        self.lanes: list[Lane] = []
        self.claimed = 0  # entries this process claimed (tests, logs)
        self.prune_at = 0.0  # monotonic time of the next pruning of finished entries
        self.hot: dict[tuple[str, str], list[str]] = {}  # per lane and database: the queues its last pass claimed from
        self.listeners: list[threading.Thread] = []
        # The databases whose listener is subscribed right now: only while every one is may the dispatcher
        # sleep LOOM_QUEUE_IDLE_POLL (a listener down means nothing would wake it: it polls).
        self.listening: set[str] = set()
        self.passes = 0  # dispatch passes (tests: a notification woke this dispatcher)

    def start(self, worker) -> None:
        global _worker_id
        self.owner = _worker_id = worker.worker_id
        self.aliases = shards.shards() if shards.sharded() else [router.db_for_write(QueueEntry)]
        self.alias = self.aliases[0]
        threads = conf.get("LOOM_QUEUE_THREADS")
        if threads == 0:
            log.info("queue dispatcher of %s: disabled (LOOM_QUEUE_THREADS=0)", self.owner)
            return
        names: list[str] = []
        for alias in self.aliases:  # every shard counts its own caps: each has the declared queues
            try:
                names = write_declared(alias)
            except DatabaseError:
                log.exception("queue dispatcher of %s: could not write the declared queues on %s; they are "
                              "written at their first enqueue", self.owner, alias)
            finally:
                connections[alias].close()
        self.pool = Runners(threads)
        async_runs = conf.get("LOOM_QUEUE_ASYNC_RUNS")
        threaded = Lane("threads", threads, False if async_runs else None,
                        lambda entry, alias: self.pool.submit(partial(self._run, threaded, entry, alias)))
        self.lanes = [threaded]
        if async_runs:
            looped = Lane("loop", async_runs, True, lambda entry, alias: self.loop_runs.submit(entry, alias))
            self.loop_runs = loop.LoopRuns(arun_claimed, partial(self._ended, looped))
            self.lanes.append(looped)
        channel = conf.get("LOOM_QUEUE_CHANNEL")
        if channel:
            self.listeners = [threading.Thread(target=self._listen, args=(alias, channel), daemon=True,
                                               name=f"loom-queue-listen-{alias}")
                              for alias in self.aliases if store_for(alias).notifications
                              and not polls_without_direct(alias, f"queue dispatcher of {self.owner}",
                                                           "LOOM_QUEUE_POLL")]
        for listener in self.listeners:
            listener.start()
        self.thread = threading.Thread(target=self._loop, name="loom-queue-dispatcher", daemon=True)
        self.thread.start()
        log.info("queue dispatcher of %s: %d thread(s)%s over database(s) %s, declared queues: %s%s", self.owner,
                 threads, f" and {async_runs} async run(s) on the event loop" if async_runs else "",
                 ", ".join(self.aliases), ", ".join(names) or "none",
                 f"; listening on {channel}" if self.listeners else "; polling")

    @property
    def free(self) -> int:
        """Free slots, every lane's."""
        return sum(lane.free for lane in self.lanes)

    def _loop(self) -> None:
        try:
            while not self.stopping.is_set():
                self.passes += 1
                got_any = busy = failed = ready = False
                prune = time.monotonic() >= self.prune_at
                if prune:
                    self.prune_at = time.monotonic() + PRUNE_EVERY
                runnable = registry.runnable()
                for alias in self.aliases:
                    store = store_for(alias)
                    try:
                        for lane in self.lanes:
                            if lane.free > 0:
                                got, held, due = self._dispatch(alias, store, lane, lane.flows(runnable))
                                got_any, busy, ready = got_any or got, busy or held, ready or due
                    except DatabaseError:
                        log.exception("queue dispatcher of %s: database error on %s; retrying", self.owner, alias)
                        connections[alias].close()
                        failed = True
                        continue
                    if prune:
                        self._prune(alias, store)
                if failed and not got_any:
                    self.stopping.wait(min(1.0, 10 * conf.get("LOOM_QUEUE_POLL")))
                    continue
                if not got_any:
                    # A queue another worker was claiming from may have slots left once it is done:
                    # look again soon rather than after a whole poll interval.
                    poll = conf.get("LOOM_QUEUE_POLL")
                    if busy:
                        pause = min(BUSY_RETRY, poll)
                    elif not ready and self.free > 0 and self.listeners and len(self.listening) == len(self.listeners):
                        pause = self._idle_pause(registry.runnable())
                    else:
                        # Due work this pass could not claim (a cap, a rate window) waits for a slot that a
                        # settle elsewhere frees without a notification: poll.
                        pause = poll
                    self.wake.wait(pause)
                    self.wake.clear()
        finally:
            for alias in self.aliases:
                connections[alias].close()

    def _idle_pause(self, flows: list[tuple[str, int]]) -> float:
        """Nothing is due and every database's listener is subscribed: an enqueue or a re-offer will wake
        us, so sleep LOOM_QUEUE_IDLE_POLL, or until the next deferred entry falls due if sooner (a deferred
        enqueue notifies too, so a sleep planned before it is shortened)."""

        pause = conf.get("LOOM_QUEUE_IDLE_POLL")
        for alias in self.aliases:
            try:
                due = store_for(alias).next_due(flows) if flows else None
            except DatabaseError:
                log.exception("queue dispatcher of %s: next due entry on %s unknown; polling", self.owner, alias)
                connections[alias].close()
                return conf.get("LOOM_QUEUE_POLL")
            if due is not None:
                pause = min(pause, max(0.0, due))
        return pause

    def _listen(self, alias: str, channel: str) -> None:
        """LISTEN on `channel` of one database: every notification wakes the dispatch loop. Subscribed, the
        loop may sleep LOOM_QUEUE_IDLE_POLL; not (cannot connect, pooled without LOOM_DIRECT, connection
        lost) it polls, and this thread tries again."""

        while not self.stopping.is_set():
            conn = listen(alias, channel)
            if conn is None:
                self.stopping.wait(1.0)
                continue
            try:
                with conn:
                    self.listening.add(alias)
                    # The LISTEN took effect: whatever committed before it is seen by the pass this wakes,
                    # whatever commits after it notifies; no enqueue falls between the two.
                    self.wake.set()
                    while not self.stopping.is_set():
                        for _ in conn.notifies(timeout=0.25, stop_after=1):
                            self.wake.set()
            except Exception as exc:
                if not self.stopping.is_set():
                    log.warning("queue dispatcher of %s: listener on %s lost its connection (%s); polling until "
                                "it reconnects", self.owner, alias, exc)
            finally:
                self.listening.discard(alias)
                self.wake.set()  # back to polling: the loop's sleep may have been planned as a long one
            self.stopping.wait(0.2)

    def _prune(self, alias: str, store) -> None:
        try:
            pruned = store.prune_entries(conf.get("LOOM_QUEUE_RETENTION"))
        except DatabaseError:
            log.exception("queue dispatcher of %s: pruning finished entries on %s failed", self.owner, alias)
            connections[alias].close()
        else:
            if pruned:
                log.info("pruned %d finished queue entr%s on %s", pruned, "y" if pruned == 1 else "ies", alias)

    def _dispatch(self, alias: str, store, lane: Lane, flows: list[tuple[str, int]]) -> tuple[bool, bool, bool]:
        """One pass of one lane over the queues of one database with work of its flows: (claimed anything,
        found a queue another worker held, some queue had work). The queues that gave the lane entries last
        time are tried first, without asking which have work."""
        if not flows:
            return False, False, False
        timeout = conf.claim_timeout()
        got_any, busy = self._claim_from(alias, store, lane, self.hot.get((lane.name, alias), []), flows, timeout)
        if got_any:
            return True, busy, True
        names = store.ready_queues(flows, timeout)
        random.shuffle(names)  # no queue always first: each gets its turn at this worker's free slots
        return *self._claim_from(alias, store, lane, names, flows, timeout), bool(names)

    def _claim_from(self, alias: str, store, lane: Lane, names: list[str], flows: list[tuple[str, int]],
                    timeout: float) -> tuple[bool, bool]:
        got_any = busy = False
        hot = []
        for name in names:
            if lane.free <= 0 or self.stopping.is_set():
                break
            claimed = store.dequeue(name, self.owner, lane.free, flows, timeout)
            if claimed is None:
                busy = True
                continue
            for entry in claimed:
                with self.lock:
                    lane.free -= 1
                    self.claimed += 1
                lane.submit(entry, alias)
            if claimed:
                hot.append(name)
                got_any = True
        self.hot[(lane.name, alias)] = hot
        return got_any, busy

    def _run(self, lane: Lane, entry, alias: str) -> None:
        try:
            run_claimed(entry, alias)
        finally:
            self._ended(lane)

    def _ended(self, lane: Lane) -> None:
        """A run of `lane` ended (in a runner thread, or on the loop): its slot is given back."""
        with self.lock:
            lane.free += 1
        self.wake.set()  # its slot is free in the database once the next dequeue sees the settled header

    def quiesce(self) -> None:
        """A graceful shutdown: claim nothing more (the runs in flight go on to their next step boundary)."""
        self.stopping.set()
        self.wake.set()

    def wait_idle(self, deadline: float) -> bool:
        if self.thread is not None:
            self.thread.join(max(0.0, deadline - time.monotonic()))
        threads = self.pool is None or self.pool.wait_idle(deadline)
        return (self.loop_runs is None or self.loop_runs.wait_idle(deadline)) and threads

    def stop(self, timeout: float) -> None:
        self.stopping.set()
        self.wake.set()
        if self.thread is not None:
            self.thread.join(timeout)
        for listener in self.listeners:  # each closes its session within 0.25 s of `stopping`
            listener.join(timeout)
        if self.pool is not None:
            # The idle runners close their sessions and are waited for. Runs in flight stop at their next
            # step once the heartbeat hands their leases back (it stops after us), then their threads close
            # theirs; their entries stay started and the executions are recovered by other workers.
            self.pool.stop(timeout)
        if self.loop_runs is not None:
            # The same for the loop lane's runs: an entry not begun yet is dropped; those in flight stop at their
            # next step boundary once their leases are handed back.
            self.loop_runs.stop()
