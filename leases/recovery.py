"""The recovery sweep: find running executions whose lease expired (or that never got one) and
finish them here.

Every LOOM_RECOVERY_EVERY seconds a worker runs one takeover transaction (leases/store): the
expired leases move to this worker and the fences advance atomically, so the former owners are
refused from then on; executions recovered LOOM_RECOVERY_MAX_ATTEMPTS times already are marked
stuck instead. Each taken execution is then resumed in a small thread pool, under the fence token
the takeover obtained (resume(..., token=...): the fence advances once per recovery), leasing
eagerly under this worker's id.

The loop is a thread of the worker, not a django-q2 schedule: django-q2 schedules are
minute-grained, and recovery must react within seconds of a TTL. leases.tasks.recovery_sweep is
the same sweep as a django-q2 task, scheduled every minute as a backstop.

Orphans (running executions without a lease past the grace) are looked for by their header's
updated_at, which stays at the moment the run became running however long it runs: reading every
header past the grace would read every long run on every sweep. So a worker's sweep reads only the
headers that passed the grace since its last complete sweep (OrphanReach), and a full orphan pass
runs at its start and every LOOM_RECOVERY_FULL_EVERY seconds, for what no window saw (a lease row
deleted under a live header, a sweep that could not run).

Logged (logger "loom.recovery", docs/workers.md "Logs"): every takeover (execution, flow, fence
token; "handed back" when it is no recovery attempt), every recovered run's end (status and duration),
every execution marked stuck.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from django.db import DatabaseError, connections

from journal import shards, telemetry
from journal.exceptions import StaleFence
from journal.flows import OwnershipLost, registry, resume
from journal.flows.interrupt import abandoned_executions
from journal.store import store_for as journal_store
from leases import conf
from leases.store import Takeover, store_for
from leases.unreachable import patiently
from leases.worker import wait_until

log = logging.getLogger("loom.recovery")
PRUNE_EVERY = 60.0  # seconds between two prunings of old worker rows by one worker
# Seconds a sweep's orphan window reaches back beyond the previous complete sweep: the two read the
# database's clock at slightly different delays after the process's, and a header's updated_at is its
# transaction's start, which may commit a little later. What falls outside is the full pass's.
ORPHAN_OVERLAP = 30.0


def sweep(owner: str, limit: int | None = None, alias: str | None = None,
          reach: OrphanReach | None = None) -> Takeover:
    """One takeover transaction for `owner` on one shard (`alias`; default: the bound or first shard), over
    the flows registered in this process (a worker without a flow's code leaves its executions to workers
    that have it). Disabled (empty) when LOOM_LEASE_MODE is off. `reach`: the caller's memory of its
    previous sweeps, which bounds how far back orphans are read; None: a full orphan pass."""
    if conf.get("LOOM_LEASE_MODE") == "off":
        return Takeover()
    flows = registry.runnable()  # (flow, version): an execution of a version not here is left to a worker that has it
    if not flows:
        return Takeover()
    ttl = conf.get("LOOM_LEASE_TTL")
    limit = limit or conf.get("LOOM_RECOVERY_BATCH")
    window = None if reach is None else reach.window(alias)
    began = time.monotonic()
    result = store_for(alias).takeover(
        owner, ttl,
        orphan_after=conf.lease_grace() + ttl,  # a live lazy run has its lease by then
        max_attempts=conf.get("LOOM_RECOVERY_MAX_ATTEMPTS"),
        limit=limit,
        flows=flows,
        orphan_window=window,
    )
    if reach is not None:
        # Fewer candidates than the limit: every orphan the window reached was taken (a full batch may
        # have left some, in no particular order: the next window still reaches back to them).
        reach.swept(alias, began, window, complete=len(result.flow_of) < limit)
    return result


class OrphanReach:
    """How far back one process's next sweep of a shard reads orphans: the full orphan pass when it never
    completed one there or its last is LOOM_RECOVERY_FULL_EVERY old, else a window from the start of its
    last complete sweep (plus ORPHAN_OVERLAP). A header's updated_at does not move while it runs, so the
    windows of consecutive sweeps, overlapping, see every header as it passes the grace: the common sweep
    reads the headers that aged past the grace since the last one, not every long run."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.covered: dict[str | None, float] = {}  # shard -> monotonic start of its last complete sweep
        self.full: dict[str | None, float] = {}  # shard -> monotonic start of its last complete full pass

    def window(self, alias: str | None) -> float | None:
        """Seconds of headers the next sweep of `alias` reads past the grace; None: a full orphan pass."""
        now = time.monotonic()
        with self.lock:
            full, covered = self.full.get(alias), self.covered.get(alias)
        if full is None or covered is None or now - full >= conf.get("LOOM_RECOVERY_FULL_EVERY"):
            return None
        return now - covered + ORPHAN_OVERLAP

    def swept(self, alias: str | None, began: float, window: float | None, complete: bool) -> None:
        """Record a sweep of `alias` that began at `began` (monotonic) with `window`; an incomplete one
        (it filled its limit) changes nothing, so the next reaches back as far again."""
        if not complete:
            return
        with self.lock:
            self.covered[alias] = max(began, self.covered.get(alias, began))
            if window is None:
                self.full[alias] = max(began, self.full.get(alias, began))


def log_takeover(result: Takeover) -> None:
    """One line per execution taken over or given up on."""
    for execution_id in result.stuck:
        log.warning("stuck execution=%s flow=%s: recovery gave up (LOOM_RECOVERY_MAX_ATTEMPTS)", execution_id,
                    result.flow_of.get(execution_id, "?"))
    handed = set(result.handed_back)
    telemetry.takeovers(len(result.taken), len(handed), len(result.stuck))  # metrics (a no-op when off)
    for execution_id, token in result.taken:
        log.info("takeover execution=%s flow=%s fence=%s%s", execution_id, result.flow_of.get(execution_id, "?"),
                 token, " handed back (no recovery attempt)" if execution_id in handed else "")


def resume_one(execution_id: str, flow: str = "?", token: int | None = None,
               stopping: Callable[[], bool] = lambda: False, count: bool = True) -> None:
    """Resume a taken-over execution in this process, under the fence `token` its takeover advanced
    to (None: resume advances it itself); failures are logged (the lease then expires and the next
    sweep takes it over again).

    The attempt is counted toward LOOM_RECOVERY_MAX_ATTEMPTS once it reached the database, before the flow's
    code runs (count_recovery); while the database cannot be reached (a connection spike), the count and
    the resume are tried again with backoff (leases/unreachable.py): that is no attempt of the flow (#35), until
    `stopping()` says the worker stops (its lease then lapses for another worker). count=False: the takeover
    was of a lease handed back at a step boundary (Takeover.handed_back): a worker stopped, no run died, so
    nothing is counted (resume still checks the header and the fence token)."""
    began = time.monotonic()
    telemetry.count("recoveries", flow=flow)
    log.info("recovering execution=%s flow=%s", execution_id, flow)
    what = f"recovery of execution={execution_id}"
    try:
        if count and token is not None and not patiently(lambda: _count_attempt(execution_id, token), what,
                                                         stopping):
            log.info("recovery skipped execution=%s flow=%s: taken over since fence %s, or no longer running",
                     execution_id, flow, token)
            return
        outcome = patiently(lambda: resume(execution_id, token=token), what, stopping)
    except BaseException as exc:  # a SystemExit the flow's own failure did not catch: logged, the thread goes on
        log.warning("recovery halted execution=%s flow=%s duration=%.3fs: %s: %s", execution_id, flow,
                    time.monotonic() - began, type(exc).__name__, exc,
                    exc_info=not isinstance(exc, (DatabaseError, *_halts())))
    else:
        level = logging.INFO if outcome.status != "failed" else logging.WARNING
        log.log(level, "recovered execution=%s flow=%s status=%s duration=%.3fs%s", execution_id, flow,
                outcome.status, time.monotonic() - began, f" error={outcome.error}" if outcome.error else "")
    finally:
        connections.close_all()


def _count_attempt(execution_id: str, token: int) -> bool:
    """One recovery attempt on the execution's header, if the fence is still the takeover's `token`."""
    with shards.on_stream(execution_id) as alias:
        return journal_store(alias).count_recovery(execution_id, token)


def _halts() -> tuple[type[Exception], ...]:
    """Errors that end a run normally (another run took over): logged without a traceback."""
    return OwnershipLost, StaleFence


def prune_workers(alias: str | None = None) -> int:
    """Delete worker rows unseen for LOOM_WORKER_RETENTION seconds on one shard (the workers page), and the
    expired lease rows of executions no run holds (settled or parked: a release lost in a crash)."""
    store = store_for(alias)
    leases = store.prune_settled_leases()
    if leases:
        log.info("pruned %d expired lease row(s) of settled or parked executions", leases)
    pruned = store.prune_workers(conf.get("LOOM_WORKER_RETENTION"))
    if pruned:
        log.info("pruned %d worker row(s) unseen for LOOM_WORKER_RETENTION", pruned)
    return pruned


class RecoveryService:
    name = "recovery-sweep"

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None
        self.pool: ThreadPoolExecutor | None = None
        self.inflight: set[str] = set()
        self.lock = threading.Lock()
        self.prune_at = 0.0  # monotonic time of the next pruning of old worker rows
        self.reach = OrphanReach()  # a full orphan pass first, then windows (and a full pass now and then)

    def start(self, worker) -> None:
        self.owner = worker.worker_id
        self.pool = ThreadPoolExecutor(max_workers=conf.get("LOOM_RECOVERY_BATCH"),
                                       thread_name_prefix="loom-recovery")
        self.thread = threading.Thread(target=self._loop, name="loom-recovery-sweep", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        try:
            while not self.stopping.wait(conf.get("LOOM_RECOVERY_EVERY")):
                prune = time.monotonic() >= self.prune_at
                if prune:
                    self.prune_at = time.monotonic() + PRUNE_EVERY
                # Every shard in turn, each its own takeover: a shard that is down is skipped (and retried
                # next round) while the others are recovered (journal/shards.py).
                for alias in shards.shards():
                    self._sweep_shard(alias, prune)
        finally:
            connections.close_all()

    def _sweep_shard(self, alias: str, prune: bool) -> None:
        free = conf.get("LOOM_RECOVERY_BATCH") - len(self.inflight)
        if free <= 0:
            return
        try:
            result = sweep(self.owner, free, alias, self.reach)
        except DatabaseError as exc:
            log.warning("recovery sweep of %s on %s failed; retrying: %s", self.owner, alias, exc)
            connections[alias].close()
            return
        log_takeover(result)
        handed = set(result.handed_back)
        for execution_id, token in result.taken:
            with self.lock:
                self.inflight.add(execution_id)
            self.pool.submit(self._resume, execution_id, result.flow_of.get(execution_id, "?"), token,
                             execution_id not in handed)
        if prune:
            try:
                prune_workers(alias)
            except DatabaseError:
                log.exception("pruning worker rows on %s failed; retrying later", alias)
                connections[alias].close()

    def _resume(self, execution_id: str, flow: str, token: int, count: bool = True) -> None:
        try:
            resume_one(execution_id, flow, token, self.stopping.is_set, count)
        finally:
            with self.lock:
                self.inflight.discard(execution_id)

    def quiesce(self) -> None:
        """A graceful shutdown: no new sweep (the resumes already taken run, and stop at their first step)."""
        self.stopping.set()

    def wait_idle(self, deadline: float) -> bool:
        if self.thread is not None:
            self.thread.join(max(0.0, deadline - time.monotonic()))
        return wait_until(lambda: not (self.inflight - abandoned_executions()), deadline)

    def stop(self, timeout: float) -> None:
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(timeout)
        if self.pool is not None:
            # Runs in flight stop at their next step once the heartbeat service hands their
            # leases back (it stops after us); do not wait for them here.
            self.pool.shutdown(wait=False, cancel_futures=True)
