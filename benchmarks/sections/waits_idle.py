"""Section `idle`: a waiting execution costs no thread. 10,000 flows sleep at once in one worker.

Method (docs/flows.md, "Benchmarks"): `--idle-flows` executions of `bench.waits.nap` (a step, a
durable sleep of `--idle-nap` seconds, a step) are parked with a scheduled start; one
`loom_worker --no-cluster` child wakes them all, runs their first step, and each parks again on its
sleep; then wakes them again and they complete. Every 0.25 s the bench samples the worker's thread
count (/proc/<pid>/task), its database connections (established TCP sockets to the server's port on
PostgreSQL; open descriptors of the database file on SQLite) and how many of the flows wait in their
sleep. Recorded: the peak number sleeping at once, the worker's threads and connections then and at
most, and the wall time for all of them. Verified: every flow completed, each once.
"""

from __future__ import annotations

import time
from datetime import timedelta

from django.utils import timezone

from benchmarks import streams
from benchmarks.arguments import positive_int
from benchmarks.harness import run_workers
from benchmarks.sections import waits
from journal.flows import start
from journal.models import Execution


def add_arguments(parser) -> None:
    parser.add_argument("--idle-flows", type=positive_int, default=10000, help="Flows sleeping at once (10000).")
    parser.add_argument("--idle-nap", type=positive_int, default=60,
                        help="Seconds each flow sleeps (60: longer than waking them all takes).")
    parser.add_argument("--idle-fill-threads", type=positive_int, default=8, help="Threads that park them (8).")


def run(ctx) -> None:
    from journal.models import Wait

    opts = ctx.options
    n, nap = opts["idle_flows"], opts["idle_nap"]
    pfx = streams.prefix(ctx.run_id, "waits-idle")
    try:
        with waits.worker(f"bench-idle-{ctx.run_id}") as proc:
            baseline = {"threads": waits.threads_of(proc.pid), "connections": waits.connections_of(proc.pid)}
            due = timezone.now() + timedelta(days=1)
            _park(ctx, pfx, n, due, opts["idle_fill_threads"])
            began = time.monotonic()
            _wake_all(ctx, pfx, n)  # their scheduled start is due now: the worker takes them
            peak = {"sleeping": -1, "threads": 0, "connections": 0}
            most = {"threads": 0, "connections": 0}
            deadline = time.monotonic() + nap + 600
            bar = ctx.progress(n, f"{n} flows")
            done = 0
            while done < n:
                proc.alive()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"idle: {done} of {n} flows completed in time:\n{proc.tail()}")
                sample = {"threads": waits.threads_of(proc.pid), "connections": waits.connections_of(proc.pid)}
                sleeping = Wait.objects.filter(execution_id__startswith=pfx, kind="sleep").count()
                for key in most:
                    most[key] = max(most[key], sample[key])
                if sleeping > peak["sleeping"]:
                    peak = {"sleeping": sleeping, **sample}
                now = Execution.objects.filter(pk__startswith=pfx, status="completed").count()
                bar.update(now - done)
                done = now
                time.sleep(0.25)
            bar.close()
            wall = time.monotonic() - began
    finally:
        if not opts.get("keep"):
            waits.remove(pfx)
    ctx.verify("idle flows completed", n, done)
    ctx.record("sleeping at once", {"flows": n, "nap_s": nap}, throughput=n / wall if wall else None,
               unit="flows/s", count=n, peak_sleeping=peak["sleeping"], threads_at_peak=peak["threads"],
               connections_at_peak=peak["connections"], threads_max=most["threads"],
               connections_max=most["connections"], threads_idle=baseline["threads"],
               connections_idle=baseline["connections"], wall_s=round(wall, 2), **waits.worker_settings())


def _park(ctx, pfx: str, n: int, due, threads: int) -> None:
    per = -(-n // threads)
    bar = ctx.progress(n, f"park {n}")

    def op(w: int, i: int) -> int:
        k = w * per + i
        if k >= n:
            return 0
        start("bench.waits.nap", {"nap": ctx.options["idle_nap"]}, execution_id=f"{pfx}{k}", start_at=due)
        return 1

    outcome = run_workers(threads, per, op, progress=bar.update)
    bar.close()
    if outcome.errors:
        raise RuntimeError(f"idle: parking failed: {outcome.errors[:3]}")
    ctx.verify("idle flows parked", n, Execution.objects.filter(pk__startswith=pfx, status="waiting").count())


def _wake_all(ctx, pfx: str, n: int) -> None:
    """Make every scheduled start due now (journal.flows.wake_now), so they all reach the worker at once."""
    from journal.flows import wake_now

    for k in range(n):
        wake_now(f"{pfx}{k}")
