"""Section `timers`: how late a durable timer fires, with 1,000 and 100,000 timers pending.

Method (docs/flows.md, "Benchmarks"): one `loom_worker --no-cluster` child runs the waker. For each
pending count N (ascending), the bench parks N executions due in a day (never due during the run:
the pending load), then `--timer-probes` probe executions due one after another, `--timer-spacing-ms`
apart, starting a lead time after they were written. A probe's first step records the wall clock
(time.time(); the bench and the worker share the machine's clock): lateness = that time - its due
time, i.e. the claim, the fence advance, the resume and the first step. Reported: p50/p99/max per N;
the plan of the waker's due-timer query at that N (its cost must not grow with N); the goal of
issue 17 (p99 under 100 ms at 100,000 pending on PostgreSQL) as met or not. Verified: every probe
completed once, no pending timer fired.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from django.utils import timezone

from benchmarks import streams
from benchmarks.arguments import positive_int, positive_int_list
from benchmarks.harness import run_workers
from benchmarks.sections import waits
from journal.flows import start
from journal.models import Execution

GOAL_MS = 100.0


def add_arguments(parser) -> None:
    parser.add_argument("--timer-pending", type=positive_int_list, default=[1000, 100000],
                        help="Comma-separated numbers of pending timers (default 1000,100000).")
    parser.add_argument("--timer-probes", type=positive_int, default=200, help="Probe timers per cell (200).")
    parser.add_argument("--timer-spacing-ms", type=positive_int, default=25,
                        help="Time between two probes' due times (25 ms).")
    parser.add_argument("--timer-fill-threads", type=positive_int, default=8,
                        help="Threads that park the pending executions (8).")


def run(ctx) -> None:
    opts = ctx.options
    pfx = streams.prefix(ctx.run_id, "waits-timers")
    probes, spacing = opts["timer_probes"], opts["timer_spacing_ms"] / 1000
    far = timezone.now() + timedelta(days=1)
    parked = 0
    try:
        with waits.worker(f"bench-timers-{ctx.run_id}") as proc:
            for n in sorted(opts["timer_pending"]):
                fill_s = _fill(ctx, pfx, parked, n, far, opts["timer_fill_threads"])
                parked = n
                plan = waits.due_plan()
                lateness = _probe(ctx, proc, f"{pfx}p{n}-", probes, spacing)
                pending = Execution.objects.filter(pk__startswith=f"{pfx}f", status="waiting").count()
                ctx.verify(f"pending timers still waiting at N={n}", n, pending)
                p99 = sorted(lateness)[min(len(lateness) - 1, int(len(lateness) * 0.99))]
                ctx.record("lateness", {"pending": n, "probes": probes, "spacing_ms": opts["timer_spacing_ms"]},
                           latencies_ms=lateness, count=probes, unit="ms late", fill_seconds=round(fill_s, 2),
                           due_query_plan=plan.get("plan"), due_query_cost=plan.get("cost"),
                           next_due_plan=plan.get("next_due_plan"), next_due_cost=plan.get("next_due_cost"),
                           goal_p99_ms=GOAL_MS, goal_met=p99 < GOAL_MS if ctx.vendor == "postgresql" else None,
                           **waits.worker_settings())
    finally:
        if not opts.get("keep"):
            waits.remove(pfx)


def _fill(ctx, pfx: str, have: int, want: int, due: datetime, threads: int) -> float:
    """Park executions until `want` are pending (ids {pfx}f<i>); seconds it took."""
    todo = want - have
    if todo <= 0:
        return 0.0
    per = -(-todo // threads)
    bar = ctx.progress(todo, f"park {want} pending")

    def op(w: int, i: int) -> int:
        k = have + w * per + i
        if k >= want:
            return 0
        out = start("bench.waits.stamp", {}, execution_id=f"{pfx}f{k}", start_at=due)
        if out.status != "waiting":
            raise RuntimeError(f"a pending timer did not park: {out}")
        return 1

    began = time.monotonic()
    outcome = run_workers(threads, per, op, progress=bar.update)
    bar.close()
    if outcome.errors:
        raise RuntimeError(f"timers: parking the pending executions failed: {outcome.errors[:3]}")
    return time.monotonic() - began


def _probe(ctx, proc: waits.WorkerProcess, pfx: str, probes: int, spacing: float) -> list[float]:
    """Probes due `spacing` apart after a lead; their lateness in ms once every one completed."""
    lead = 1.0 + probes * 0.01  # writing them must end before the first is due
    first = timezone.now() + timedelta(seconds=lead)
    due = {f"{pfx}{i}": first + timedelta(seconds=i * spacing) for i in range(probes)}
    for eid, when in due.items():
        start("bench.waits.stamp", {}, execution_id=eid, start_at=when)
    deadline = time.monotonic() + lead + probes * spacing + 120
    bar = ctx.progress(probes, f"probes ({pfx})")
    done = 0
    while done < probes:
        proc.alive()
        if time.monotonic() > deadline:
            raise RuntimeError(f"timers: only {done} of {probes} probes fired within the deadline:\n{proc.tail()}")
        time.sleep(0.2)
        now = Execution.objects.filter(pk__startswith=pfx, status="completed").count()
        bar.update(now - done)
        done = now
    bar.close()
    results = dict(Execution.objects.filter(pk__startswith=pfx).values_list("pk", "result"))
    ctx.verify(f"probes completed ({pfx})", probes, len(results))
    return [round((results[eid] - when.astimezone(UTC).timestamp()) * 1000, 3) for eid, when in due.items()]
