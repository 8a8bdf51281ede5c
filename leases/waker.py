"""The waker: a worker service that resumes parked executions when their wait is due.

One thread claims due waits (journal store `claim_due_waits`: FOR UPDATE SKIP LOCKED on PostgreSQL,
so two workers racing for one due row wake it once) and resumes each under the fence its claim
advanced to, in a pool of LOOM_WAIT_BATCH threads; a parked execution costs no thread until then.
It sleeps until the earliest due wait (one probe of the due index) or LOOM_WAIT_POLL, whichever is
sooner; on PostgreSQL a second thread LISTENs on LOOM_WAIT_CHANNEL and wakes it early (a message
sent, a child settled, a wait parked with an earlier due time, wake_now). A waker that dies after
a claim leaves running executions without a lease: the recovery sweep takes them over.

With LOOM_SHARDS one service runs a waker per shard (`parts`, like the drains and the recovery sweep):
each claims its own shard's due waits, listens on its own shard's channel, and a shard that is down only
stalls its own part (logged, retried every LOOM_WAIT_POLL).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from django.db import DatabaseError, connections

from journal import conf, shards
from journal.flows import registry, resume
from journal.flows.interrupt import abandoned_executions
from journal.listen import listen, polls_without_direct
from journal.store import store_for
from leases.unreachable import patiently
from leases.worker import wait_until

log = logging.getLogger("loom.waker")


def resume_woken(execution_id: str, token: int, stopping: Callable[[], bool] = lambda: False) -> None:
    """Run a claimed execution here under the claim's fence; failures are logged (a halted run's
    execution is recovered by the sweep, or parked again by whoever took it over)."""
    try:
        # force: the claim took the execution over (the fence moved from the parked run's token), so
        # the lease row a parked run has not handed back yet (released in the background) proves nothing.
        # A database it cannot reach (a connection spike) is waited out with backoff, under the same token: the
        # execution stays running meanwhile, so a sweep may take it over, and then this run stops (#35).
        outcome = patiently(lambda: resume(execution_id, token=token, force=True), f"woken execution={execution_id}",
                            stopping)
        log.info("woken execution=%s status=%s", execution_id, outcome.status)
    except BaseException as exc:  # nothing unwinds the waker's thread (a flow's SystemExit is its failure)
        log.warning("woken execution=%s halted: %s: %s", execution_id, type(exc).__name__, exc)
    finally:
        connections.close_all()


class WakeService:
    name = "flow-waker"

    def __init__(self, alias: str | None = None) -> None:
        # No alias and several shards: one waker per shard under this one (`parts`).
        self.parts: list[WakeService] = []
        if alias is None and shards.sharded():
            self.parts = [WakeService(each) for each in shards.shards()]
        self.alias = alias or shards.home()
        self.stopping = threading.Event()
        self.nudge = threading.Event()  # set by the listener (and stop): look for due waits now
        self.threads: list[threading.Thread] = []
        self.pool: ThreadPoolExecutor | None = None
        self.inflight: set[str] = set()
        self.lock = threading.Lock()
        self._woken = 0
        self.claimed_at = None  # the `now` of the last claim (_pause: what became due since)

    @property
    def woken(self) -> int:
        """Executions this service (every shard's part) resumed (tests and the bench read it)."""
        return self._woken + sum(part.woken for part in self.parts)

    def start(self, worker) -> None:
        if self.parts:
            for part in self.parts:
                part.start(worker)
            return
        self.pool = ThreadPoolExecutor(max_workers=conf.get("LOOM_WAIT_BATCH"), thread_name_prefix="loom-woken")
        self.threads = [threading.Thread(target=self._loop, name="loom-waker", daemon=True)]
        if store_for(self.alias).wait_notifications and not polls_without_direct(
                self.alias, "waker of parked executions", "LOOM_WAIT_POLL"):
            self.threads.append(threading.Thread(target=self._listen, name="loom-waker-listen", daemon=True))
        for thread in self.threads:
            thread.start()

    def claim(self) -> int:
        """One claim of as many due waits as there are free threads; each resumed in the pool."""
        from django.utils import timezone

        free = conf.get("LOOM_WAIT_BATCH") - len(self.inflight)
        flows = registry.runnable()  # (flow, version): waits of versions not here are left to workers that have them
        self.claimed_at = timezone.now()
        if free <= 0 or not flows:
            return 0
        claimed = store_for(self.alias).claim_due_waits(self.claimed_at, free, flows)
        for item in claimed:
            with self.lock:
                self.inflight.add(item.execution_id)
            self.pool.submit(self._run, item.execution_id, item.token)
        return len(claimed)

    def _run(self, execution_id: str, token: int) -> None:
        try:
            resume_woken(execution_id, token, self.stopping.is_set)
        finally:
            with self.lock:
                self.inflight.discard(execution_id)
                self._woken += 1
            self.nudge.set()  # a thread is free again

    def _pause(self, taken: int) -> float:
        """How long to sleep after a claim that took `taken`: not at all while it keeps finding work
        and has free threads; LOOM_WAIT_POLL when the pool is full (a finishing run nudges) or when
        what was due at the claim and still is cannot be claimed here (a header a sender holds, whose
        commit notifies); not at all if a wait became due after the claim's `now` (it would fire a whole
        poll late); else until the earliest due wait, at most LOOM_WAIT_POLL. Only waits of the flows
        registered here count (another worker's are none of this one's business)."""
        from django.utils import timezone

        poll = conf.get("LOOM_WAIT_POLL")
        free = conf.get("LOOM_WAIT_BATCH") - len(self.inflight)
        if free <= 0:
            return poll
        if taken:
            return 0.0
        due = store_for(self.alias).next_wait_due(registry.runnable())
        if due is None:
            return poll
        if self.claimed_at is not None and due > self.claimed_at:
            return max(0.0, min(poll, (due - timezone.now()).total_seconds()))  # due since the claim: claim again
        return poll  # due at the claim and not taken: locked by a sender or another worker

    def _loop(self) -> None:
        try:
            while not self.stopping.is_set():
                try:
                    pause = self._pause(self.claim())
                except DatabaseError:
                    log.exception("waker of %s: claim failed; retrying", self.alias)
                    connections.close_all()
                    pause = conf.get("LOOM_WAIT_POLL")
                if pause > 0:
                    self.nudge.wait(pause)
                self.nudge.clear()
        finally:
            connections.close_all()

    def _listen(self) -> None:
        """LISTEN on LOOM_WAIT_CHANNEL: every notification nudges the claim loop (a poll remains)."""
        while not self.stopping.is_set():
            conn = listen(self.alias, conf.get("LOOM_WAIT_CHANNEL"))
            if conn is None:
                self.stopping.wait(1.0)
                continue
            try:
                with conn:
                    self.nudge.set()  # anything made due while we were not listening
                    while not self.stopping.is_set():
                        for _ in conn.notifies(timeout=0.25, stop_after=1):
                            self.nudge.set()
            except Exception as exc:
                if not self.stopping.is_set():
                    log.warning("waker listener: connection lost (%s); reconnecting", exc)
                    time.sleep(0.2)

    def quiesce(self) -> None:
        """A graceful shutdown: no new claim (the woken runs already claimed run, and stop at their first step)."""
        for part in self.parts:
            part.quiesce()
        self.stopping.set()
        self.nudge.set()

    def wait_idle(self, deadline: float) -> bool:
        idle = all([part.wait_idle(deadline) for part in self.parts])
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return wait_until(lambda: not (self.inflight - abandoned_executions()), deadline) and idle

    def stop(self, timeout: float) -> None:
        for part in self.parts:
            part.stop(timeout)
        self.stopping.set()
        self.nudge.set()
        for thread in self.threads:
            thread.join(timeout)
        if self.pool is not None:
            # Runs in flight stop at their next step once the heartbeat service hands their leases
            # back (it stops after us), or park; do not wait for them here.
            self.pool.shutdown(wait=False, cancel_futures=True)
