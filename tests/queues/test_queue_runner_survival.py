"""A run that raises a BaseException (SystemExit from a library, asyncio's CancelledError, ...) must not kill its
runner thread: QueueService._run's finally gives the slot back, so the dispatcher would go on claiming entries
for a thread that no longer exists, and they would wait in the task queue, never begun (review r2, F2)."""

from __future__ import annotations

import threading

from queues.service import Runners


def test_a_runner_thread_survives_a_run_that_raises_a_base_exception():
    pool = Runners(1)
    ran = threading.Event()

    def bad():
        raise SystemExit("a library called sys.exit() inside a step")

    pool.submit(bad)
    pool.submit(ran.set)  # the next claimed entry, handed to the (only) free runner
    try:
        assert ran.wait(5), f"the next run never began; runner threads alive: {[t.is_alive() for t in pool.threads]}"
    finally:
        pool.stop(1)
