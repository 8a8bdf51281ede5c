"""The recovery sweep: find running executions whose lease expired (or that never got one) and
finish them here.

Every LOOM_RECOVERY_EVERY seconds a worker runs one takeover transaction (leases/store): the
expired leases move to this worker and the fences advance atomically, so the former owners are
refused from then on; executions recovered LOOM_RECOVERY_MAX_ATTEMPTS times already are marked
stuck instead. Each taken execution is then resumed in a small thread pool (resume advances the
fence once more and leases eagerly under this worker's id).

The loop is a thread of the worker, not a django-q2 schedule: django-q2 schedules are
minute-grained, and recovery must react within seconds of a TTL. leases.tasks.recovery_sweep is
the same sweep as a django-q2 task, scheduled every minute as a backstop.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

from django.db import DatabaseError, connections

from journal import conf
from leases.store import Takeover, store_for

log = logging.getLogger("loom.recovery")


def sweep(owner: str, limit: int | None = None) -> Takeover:
    """One takeover transaction for `owner`, over the flows registered in this process (a worker
    without a flow's code leaves its executions to workers that have it). Disabled (empty) when
    LOOM_LEASE_MODE is off."""
    from journal.flows import registry

    if conf.get("LOOM_LEASE_MODE") == "off":
        return Takeover()
    flows = sorted(registry.registered())
    if not flows:
        return Takeover()
    ttl = conf.get("LOOM_LEASE_TTL")
    return store_for().takeover(
        owner, ttl,
        orphan_after=conf.lease_grace() + ttl,  # a live lazy run has its lease by then
        max_attempts=conf.get("LOOM_RECOVERY_MAX_ATTEMPTS"),
        limit=limit or conf.get("LOOM_RECOVERY_BATCH"),
        flows=flows,
    )


def resume_one(execution_id: str) -> None:
    """Resume a taken-over execution in this process; failures are logged (the lease then
    expires and the next sweep counts another attempt)."""
    from journal.flows import resume

    try:
        resume(execution_id)
    except Exception:
        log.exception("recovery: resuming %s failed", execution_id)
    finally:
        connections.close_all()


class RecoveryService:
    name = "recovery-sweep"

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None
        self.pool: ThreadPoolExecutor | None = None
        self.inflight: set[str] = set()
        self.lock = threading.Lock()

    def start(self, worker) -> None:
        self.owner = worker.worker_id
        self.pool = ThreadPoolExecutor(max_workers=conf.get("LOOM_RECOVERY_BATCH"),
                                       thread_name_prefix="loom-recovery")
        self.thread = threading.Thread(target=self._loop, name="loom-recovery-sweep", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        try:
            while not self.stopping.wait(conf.get("LOOM_RECOVERY_EVERY")):
                free = conf.get("LOOM_RECOVERY_BATCH") - len(self.inflight)
                if free <= 0:
                    continue
                try:
                    result = sweep(self.owner, free)
                except DatabaseError:
                    log.exception("recovery sweep of %s failed; retrying", self.owner)
                    connections.close_all()
                    continue
                for execution_id in result.stuck:
                    log.warning("recovery: %s marked stuck", execution_id)
                for execution_id, _token in result.taken:
                    with self.lock:
                        self.inflight.add(execution_id)
                    self.pool.submit(self._resume, execution_id)
        finally:
            connections.close_all()

    def _resume(self, execution_id: str) -> None:
        try:
            resume_one(execution_id)
        finally:
            with self.lock:
                self.inflight.discard(execution_id)

    def stop(self, timeout: float) -> None:
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(timeout)
        if self.pool is not None:
            # Runs in flight stop at their next step once the heartbeat service hands their
            # leases back (it stops after us); do not wait for them here.
            self.pool.shutdown(wait=False, cancel_futures=True)
