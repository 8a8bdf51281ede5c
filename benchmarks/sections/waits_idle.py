"""Section `idle`: a waiting execution costs no thread. 10,000 flows sleep at once in one worker.

Method (docs/flows.md, "Benchmarks"): one `loom_worker --no-cluster` child runs the waker. The bench
starts `--idle-flows` executions of `bench.waits.nap` (a step, a durable sleep of `--idle-nap`
seconds, a step) on `--idle-fill-threads` threads: each runs its first step and parks on its sleep.
While they all sleep, the bench samples the worker every 0.25 s for `--idle-sample-seconds`: its
thread count (/proc/<pid>/task), its database connections (established TCP sockets to the server's
port on PostgreSQL; open descriptors of the database file on SQLite) and how many flows wait in
their sleep. Then it ends every sleep at once (`wake_now`) and the worker wakes and finishes them
all, still sampled. Recorded: flows sleeping at once, the worker's threads and connections while
they sleep and at most while it wakes them, and how fast it woke them. Verified: every flow parked,
and completed, once.
"""

from __future__ import annotations

import time

from benchmarks import streams
from benchmarks.arguments import positive_int
from benchmarks.harness import run_workers
from benchmarks.sections import waits
from journal.flows import start, wake_now
from journal.models import Execution, Wait


def add_arguments(parser) -> None:
    parser.add_argument("--idle-flows", type=positive_int, default=10000, help="Flows sleeping at once (10000).")
    parser.add_argument("--idle-nap", type=positive_int, default=3600,
                        help="Seconds each flow would sleep (3600; the bench ends the sleeps itself).")
    parser.add_argument("--idle-sample-seconds", type=positive_int, default=5,
                        help="Seconds the worker is sampled while every flow sleeps (5).")
    parser.add_argument("--idle-fill-threads", type=positive_int, default=8, help="Threads that start them (8).")


def run(ctx) -> None:
    opts = ctx.options
    n, threads = opts["idle_flows"], opts["idle_fill_threads"]
    pfx = streams.prefix(ctx.run_id, "waits-idle")
    ids = [f"{pfx}{k}" for k in range(n)]
    try:
        with waits.worker(f"bench-idle-{ctx.run_id}") as proc:
            idle = _sample(proc)
            _each(ctx, ids, threads, "park", lambda eid: _park(eid, opts["idle_nap"]))
            sleeping = Wait.objects.filter(execution_id__startswith=pfx, kind="sleep").count()
            ctx.verify("idle flows asleep at once", n, sleeping)
            asleep = {"threads": 0, "connections": 0}
            until = time.monotonic() + opts["idle_sample_seconds"]
            while time.monotonic() < until:
                proc.alive()
                asleep = {k: max(v, _sample(proc)[k]) for k, v in asleep.items()}
                time.sleep(0.25)
            began = time.monotonic()
            _each(ctx, ids, threads, "wake", wake_now)
            most, done = dict(asleep), 0
            deadline = time.monotonic() + 1800
            bar = ctx.progress(n, f"{n} flows woken")
            while done < n:
                proc.alive()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"idle: {done} of {n} flows completed in time:\n{proc.tail()}")
                most = {k: max(v, _sample(proc)[k]) for k, v in most.items()}
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
    ctx.record("sleeping at once", {"flows": n, "nap_s": opts["idle_nap"]}, throughput=n / wall if wall else None,
               unit="flows woken/s", count=n, sleeping_at_once=sleeping, threads_while_asleep=asleep["threads"],
               connections_while_asleep=asleep["connections"], threads_waking_max=most["threads"],
               connections_waking_max=most["connections"], threads_before=idle["threads"],
               connections_before=idle["connections"], wake_all_s=round(wall, 2), **waits.worker_settings())


def _sample(proc: waits.WorkerProcess) -> dict:
    return {"threads": waits.threads_of(proc.pid), "connections": waits.connections_of(proc.pid)}


def _park(execution_id: str, nap: int) -> int:
    out = start("bench.waits.nap", {"nap": nap}, execution_id=execution_id)
    if out.status != "waiting":
        raise RuntimeError(f"idle: {execution_id} did not park on its sleep: {out}")
    return 1


def _each(ctx, ids: list[str], threads: int, what: str, fn) -> None:
    """fn(id) for every id, on `threads` threads."""
    per = -(-len(ids) // threads)
    bar = ctx.progress(len(ids), what)

    def op(w: int, i: int) -> int:
        k = w * per + i
        if k >= len(ids):
            return 0
        fn(ids[k])
        return 1

    outcome = run_workers(threads, per, op, progress=bar.update)
    bar.close()
    if outcome.errors:
        raise RuntimeError(f"idle: {what} failed: {outcome.errors[:3]}")
    ctx.verify(f"idle flows {what}", len(ids), outcome.units)
