"""Waiting callers: N coroutines on `aget_event` against N threads on the sync `get_event`, one execution, one key.

    python manage.py shell -c "from benchmarks.async_waiters import main; main(1000, 50)"

Every waiter waits for the same flow event; the flow (woken by a message once all wait) publishes the wall-clock
time just before its set_event commits; each waiter's wake-up is the time from there to its return. Reported per
variant: waiters, the most threads this process had and the most database sessions of this database it held while
they waited (pg_stat_activity on PostgreSQL), and the wake-up p50/p99. The sync variant runs fewer waiters: each
holds a thread AND that thread's session, and 1,000 would pass the server's max_connections (100 here) — which
is the finding. docs/benchmarks.md "Waiting callers" records a run.

    python manage.py shell -c "from benchmarks.async_waiters import sleepers; sleepers(500, 50, 2.0)"

Short sleepers: N async flows started with `astart`, each sleeping `seconds` in-process (under
LOOM_WAIT_INLINE_MAX, so it does not park) between two steps, against N threads each running the same flow with the
sync `start` (its drive thread holds the sleep, as every async run did before issue 34's loop-driven runs). Reported:
threads and sessions held above the baseline while they sleep, and each run's time beyond its sleep (p50/p99).
docs/benchmarks.md "Short sleepers" records a run.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time

from asgiref.sync import async_to_sync
from django.db import connection

from journal.flows import flow
from journal.flows.aio import astart
from journal.flows.runtime import start as start_flow

FLOW = "bench.async_waiters.publisher"
SLEEPER = "bench.async_waiters.sleeper"


@flow(FLOW)
def publisher(ctx, value):
    ctx.recv("go")
    ctx.set_event("ready", time.time())  # just before the commit: a wake-up is measured from here
    return "published"


async def _tick(value):
    return value


@flow(SLEEPER)
async def sleeper(ctx, value):
    await ctx.step("before", _tick, 1)
    await ctx.sleep(value["seconds"])  # in-process: shorter than LOOM_WAIT_INLINE_MAX
    return await ctx.step("after", _tick, 2)


async def _all_waiting(waiters: int) -> None:
    """Until every waiter has read once and subscribed (PostgreSQL: the listener counts them; SQLite: a pause)."""
    if connection.vendor != "postgresql":
        await asyncio.sleep(3.0)
        return
    from journal.flows.event_listener import listener_for

    listener = listener_for("default")
    deadline = time.monotonic() + 120
    while (listener.waiting() < waiters or not listener.connected) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)


def _sessions() -> int | None:
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
        return cursor.fetchone()[0]


def _release(execution_id: str) -> None:
    from journal.flows import send, wake_due

    send(execution_id, "go", 1)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not [o for o in wake_due() if o.execution_id == execution_id]:
        time.sleep(0.01)


def _watch(peak: dict, stop: threading.Event) -> None:
    while not stop.is_set():
        peak["threads"] = max(peak["threads"], threading.active_count())
        sessions = _sessions()
        if sessions is not None:
            peak["sessions"] = max(peak["sessions"], sessions)
        stop.wait(0.05)
    connection.close()


def _report(kind: str, waiters: int, wakes: list[float], peak: dict, base: dict) -> dict:
    wakes = sorted(wakes)
    row = {"variant": kind, "waiters": waiters, "woken": len(wakes),
           "threads_held": peak["threads"] - base["threads"],
           "sessions_held": None if base["sessions"] is None else peak["sessions"] - base["sessions"],
           "p50_ms": round(statistics.median(wakes) * 1000, 1) if wakes else None,
           "p99_ms": round(wakes[max(0, int(len(wakes) * 0.99) - 1)] * 1000, 1) if wakes else None}
    print(row)
    return row


def _baseline() -> dict:
    return {"threads": threading.active_count() + 1, "sessions": _sessions()}  # +1: the watcher itself


def run_async(waiters: int) -> dict:
    from journal.flows import start
    from journal.flows.aio import aget_event

    eid = start(FLOW, {}).execution_id
    base, peak, stop = _baseline(), {"threads": 0, "sessions": 0}, threading.Event()
    watcher = threading.Thread(target=_watch, args=(peak, stop), daemon=True)
    watcher.start()

    async def scenario() -> list[float]:
        async def one() -> float:
            value = await aget_event(eid, "ready", timeout=60)
            return time.time() - value

        tasks = [asyncio.ensure_future(one()) for _ in range(waiters)]
        await _all_waiting(waiters)
        await asyncio.get_running_loop().run_in_executor(None, _release, eid)
        return await asyncio.gather(*tasks)

    wakes = asyncio.run(scenario())
    stop.set()
    watcher.join()
    return _report("aget_event", waiters, wakes, peak, base)


def run_sync(waiters: int) -> dict:
    from journal.flows import get_event, start

    eid = start(FLOW, {}).execution_id
    base, peak, stop = _baseline(), {"threads": 0, "sessions": 0}, threading.Event()
    watcher = threading.Thread(target=_watch, args=(peak, stop), daemon=True)
    watcher.start()
    wakes: list[float] = []
    lock = threading.Lock()

    def one() -> None:
        try:
            value = get_event(eid, "ready", timeout=60)
            with lock:
                wakes.append(time.time() - value)
        finally:
            connection.close()

    threads = [threading.Thread(target=one) for _ in range(waiters)]
    for thread in threads:
        thread.start()
    async_to_sync(_all_waiting)(waiters)
    _release(eid)
    for thread in threads:
        thread.join()
    stop.set()
    watcher.join()
    return _report("get_event (sync)", waiters, wakes, peak, base)


def main(async_waiters: int = 1000, sync_waiters: int = 50) -> list[dict]:
    return [run_async(async_waiters), run_sync(sync_waiters)]


def sleepers(async_runs: int = 500, sync_runs: int = 50, seconds: float = 2.0) -> list[dict]:
    """Short sleepers: `async_runs` astart-driven runs against `sync_runs` thread-driven ones (module docstring)."""
    from django.test.utils import override_settings

    with override_settings(LOOM_WAIT_INLINE_MAX=max(30.0, seconds * 2)):
        return [_sleepers_async(async_runs, seconds), _sleepers_sync(sync_runs, seconds)]


def _sleepers_async(runs: int, seconds: float) -> dict:
    base, peak, stop = _baseline(), {"threads": 0, "sessions": 0}, threading.Event()
    watcher = threading.Thread(target=_watch, args=(peak, stop), daemon=True)
    watcher.start()

    async def scenario() -> list[float]:
        async def one() -> float:
            began = time.monotonic()
            out = await astart(SLEEPER, {"seconds": seconds})
            assert out.status == "completed", out
            return time.monotonic() - began - seconds

        return await asyncio.gather(*(one() for _ in range(runs)))

    late = asyncio.run(scenario())
    stop.set()
    watcher.join()
    return _report("astart, loop-driven (short sleep)", runs, late, peak, base)


def _sleepers_sync(runs: int, seconds: float) -> dict:
    base, peak, stop = _baseline(), {"threads": 0, "sessions": 0}, threading.Event()
    watcher = threading.Thread(target=_watch, args=(peak, stop), daemon=True)
    watcher.start()
    late: list[float] = []
    lock = threading.Lock()

    def one() -> None:
        try:
            began = time.monotonic()
            out = start_flow(SLEEPER, {"seconds": seconds})
            assert out.status == "completed", out
            with lock:
                late.append(time.monotonic() - began - seconds)
        finally:
            connection.close()

    threads = [threading.Thread(target=one) for _ in range(runs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stop.set()
    watcher.join()
    return _report("start, thread-driven (short sleep)", runs, late, peak, base)
