"""The step watchdog: a worker service that tells running steps to stop, takes a silent step's lease away, and
retires the worker when a step ignores what it was told (journal/flows/interrupt.py).

Every WATCH_EVERY seconds it looks at the steps running in this process (memory only, no statement):
- a step past its `timeout`, or whose run lost its claim (a `cancel()` or a takeover moved the fence; the lease
  keeper's renewal sees it), is told (its next heartbeat() raises, cancelled() is True);
- a step with a `heartbeat_timeout` that has not heartbeaten for that long is told too, and its lease is
  handed back at once (expired): another worker's sweep takes the execution over, and whatever this run
  writes later is refused by the fence. A step whose worker hangs without dying no longer keeps its lease
  forever (the keeper thread would renew it);
- a step told LOOM_STEP_ABANDON_AFTER seconds ago and still running is abandoned: Python cannot stop its
  thread, so the worker retires (a graceful stop of everything else, every lease handed back) and is replaced
  (`loom_worker` re-executes itself; a django-q2 child exits and its sentinel starts another), the way the API
  retires a worker whose call hung (loomapi/worker.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from journal.flows import interrupt

log = logging.getLogger("loom.worker")
WATCH_EVERY = 0.2  # seconds between two looks at the running steps (memory only)


class StepWatchdog:
    name = "step-watchdog"

    def __init__(self, retire: Callable[[str], None] | None = None) -> None:
        self.retire = retire  # None: the worker's retire (set at start)
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None
        self.told: set[int] = set()
        self.retired: str | None = None

    def start(self, worker) -> None:
        if self.retire is None:
            self.retire = worker.retire
        self.thread = threading.Thread(target=self._loop, name="loom-step-watchdog", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stopping.wait(WATCH_EVERY):
            try:
                self.check()
            except Exception:  # the watchdog outlives any one look
                log.exception("step watchdog: check failed")

    def check(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        bound = interrupt.abandon_after()
        steps = interrupt.running_steps()
        self.told &= {id(step) for step in steps}
        for step in steps:
            reason = step.refresh(now)
            if reason is None and step.heartbeat_timeout is not None and now - step.last_beat > step.heartbeat_timeout:
                step.tell(interrupt.HEARTBEAT)
                reason = interrupt.HEARTBEAT
                hand_back = getattr(step.claim, "hand_back", None)
                if hand_back is not None:
                    hand_back()
                log.warning("heartbeat timeout execution=%s step=%s pos=%d: silent for %.1f s (heartbeat_timeout "
                            "%.1f s); its lease was handed back, another worker takes it over", step.execution_id,
                            step.name, step.pos, now - step.last_beat, step.heartbeat_timeout)
            if reason is None:
                continue
            if id(step) not in self.told:
                self.told.add(id(step))
                log.warning("told execution=%s step=%s pos=%d to stop: %s (abandoned if still running in %.1f s)",
                            step.execution_id, step.name, step.pos, reason, bound)
            if step.told_at is not None and now - step.told_at > bound and self.retired is None:
                interrupt.abandon(step)
                self.retired = (f"step {step.name!r} of execution {step.execution_id!r} ignored being told to stop "
                                f"({reason}) for {bound:.1f} s (LOOM_STEP_ABANDON_AFTER)")
                log.error("abandoned execution=%s step=%s pos=%d: %s; the worker retires and is replaced",
                          step.execution_id, step.name, step.pos, self.retired)
                self.retire(self.retired)

    def stop(self, timeout: float) -> None:
        self.stopping.set()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout)
