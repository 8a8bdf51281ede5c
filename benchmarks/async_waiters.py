"""Waiting callers: N coroutines on `aget_event` against N threads on the sync `get_event`, one execution, one key.

    python manage.py shell -c "from benchmarks.async_waiters import main; main(1000, 50)"

Every waiter waits for the same flow event; the flow (woken by a message once all wait) publishes the wall-clock
time just before its set_event commits; each waiter's wake-up is the time from there to its return. Reported per
variant: waiters, the most threads this process had and the most database sessions of this database it held while
they waited (pg_stat_activity on PostgreSQL), and the wake-up p50/p99. The sync variant runs fewer waiters: each
holds a thread AND that thread's session, and 1,000 would pass the server's max_connections (100 here) — which
is the finding. docs/benchmarks.md "Waiting callers" records a run.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time

from asgiref.sync import async_to_sync
from django.db import connection

from journal.flows import flow

FLOW = "bench.async_waiters.publisher"


@flow(FLOW)
def publisher(ctx, value):
    ctx.recv("go")
    ctx.set_event("ready", time.time())  # just before the commit: a wake-up is measured from here
    return "published"


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
