"""The loop lane of a worker's queue dispatcher: claimed entries of `async def` flows run on the process's event
loop (journal/flows/aio.py `loop()`, one daemon thread per process), many at once, none holding a thread while it
sleeps.

Why a lane of its own: a queue runner thread (queues/service.py `Runners`) drives one run at a time, so an async
run in a short in-process sleep held its thread, and the thread's slot, for the whole sleep. Here an entry's run
is a task on the loop (`arun_claimed`): its begin (the claim check, the header's lock, the fence advanced from the
enqueue's: journal/flows/queued.py `run_queued`, the same code as on a runner thread) runs in a thread of the
journal's async pool (LOOM_ASYNC_DB_THREADS), then `Runner.adrive` drives the run from the loop, each journal call
in a pool thread, its short sleeps and retry backoffs slept on the loop. So LOOM_QUEUE_ASYNC_RUNS runs in flight
cost the pool's threads and sessions, not one each.

The lane counts its own slots (LOOM_QUEUE_ASYNC_RUNS), not the runner threads' (LOOM_QUEUE_THREADS); the queues'
caps and rate limits are the database's, unchanged: they count running executions, whoever runs them. A graceful
shutdown treats a loop run as a thread run: the claim's `draining` stops it at its next step boundary, with the
step it was in recorded, and hands its lease back (journal/flows/runtime.py `yield_if_draining`); `wait_idle`
waits for every run of the lane to end.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Awaitable, Callable

from journal import telemetry
from journal.flows import aio
from leases.worker import wait_until

log = logging.getLogger("loom.queues")


def traced_dispatch(arun_claimed: Callable[..., Awaitable[str]]) -> Callable[..., Awaitable[str]]:
    """telemetry.traced_dispatch for an entry run from the loop: the same `loom.queue.dispatch` span around its
    whole run (begin and drive; the run's own span inside it) and the same dispatch lag. The span's parent may
    need a read of the execution's first event (telemetry.dispatch_parent): in the pool, never on the loop."""

    @functools.wraps(arun_claimed)
    async def wrapper(claimed, using: str | None = None) -> str:
        if not telemetry.TRACING and not telemetry.METRICS:
            return await arun_claimed(claimed, using)
        if claimed.lag is not None:
            telemetry.observe("dispatch_lag", max(0.0, claimed.lag), queue=claimed.queue)
        parent = None
        if telemetry.TRACING:
            parent = await aio.in_pool(telemetry.dispatch_parent, claimed.execution_id, claimed.meta)
        with telemetry.dispatch_span(claimed.execution_id, claimed.flow, claimed.meta, parent):
            return await arun_claimed(claimed, using)

    return wrapper


class LoopRuns:
    """The runs of one dispatcher's loop lane in flight: each a task on the process loop, `run(entry, alias)`
    awaited, then `ended()` (the slot given back, the dispatcher woken).

    stop(): an entry handed over after it is dropped, not begun (its claim is offered again after
    LOOM_QUEUE_CLAIM_TIMEOUT), as the runner threads drop theirs; the runs in flight go on to their next step
    boundary, where the lost or handed-back claim stops them (the lease heartbeat stops after the dispatcher)."""

    def __init__(self, run: Callable[..., Awaitable[str]], ended: Callable[[], None]) -> None:
        self.run = run
        self.ended = ended
        self.lock = threading.Lock()  # `running` is raised by the dispatcher thread, lowered on the loop
        self.running = 0
        self.stopping = False

    def submit(self, entry, alias: str) -> None:
        """From the dispatcher thread: run `entry` on the loop (its slot was taken by the caller)."""
        with self.lock:
            self.running += 1
        asyncio.run_coroutine_threadsafe(self._run(entry, alias), aio.loop())

    async def _run(self, entry, alias: str) -> None:
        try:
            if not self.stopping:  # else handed over too late: not begun, offered again after the claim timeout
                await self.run(entry, alias)
        except BaseException:  # a SystemExit from a flow's library must not reach the loop: it would stop it
            log.exception("queue loop run of %s: failed", entry.execution_id)
        finally:
            with self.lock:
                self.running -= 1
            self.ended()

    def wait_idle(self, deadline: float) -> bool:
        """A graceful shutdown: wait until no run of the lane is in flight, or the monotonic `deadline`."""
        return wait_until(lambda: self.running == 0, deadline)

    def stop(self) -> None:
        self.stopping = True
