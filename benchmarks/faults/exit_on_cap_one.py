"""exit-on-cap-one: queued flows that call sys.exit() on a queue of concurrency 1, between ordinary ones, run by
a `loom_worker`. Before issue 35 the first one unwound its run: recovery re-ran it until it was marked stuck
with no error recorded, and it kept the queue's only slot meanwhile, so the queue stopped.

Invariants: every exiting execution failed once, its error naming SystemExit, never recovered; every other
completed with each step's effect once; the worker alive throughout and stopping on SIGTERM; no lease left."""

from __future__ import annotations

import json

from benchmarks.faults.base import Round, Verdict
from benchmarks.faults.processes import wait_until
from journal.models import Execution

NAME = "exit-on-cap-one"
POSTGRES_ONLY = True
QUEUE = "faults-exit-cap1"


def run(r: Round) -> Verdict:
    from queues import declare_queue, enqueue
    from queues.declarations import forget

    n, steps = r.opt("executions"), r.opt("steps")
    r.params.update(executions=2 * n, exiting=n, steps=steps)
    verdict = r.verdict
    declare_queue(QUEUE, concurrency=1)
    exiting, ordinary = [], []
    try:
        for i in range(n):  # an exit first, then an ordinary one behind it, and so on
            exiting.append(enqueue("faults.exits", {}, queue=QUEUE, execution_id=f"{r.prefix}x{i}").execution_id)
            ordinary.append(enqueue("faults.steps", {"n": steps, "pause": 0.0}, queue=QUEUE,
                                    execution_id=f"{r.prefix}q{i}").execution_id)
        with r.pool() as pool:
            env = r.env(LOOM_QUEUES=json.dumps({QUEUE: {"concurrency": 1}}), LOOM_QUEUE_THREADS="2",
                        LOOM_QUEUE_POLL="0.05")
            worker = pool.worker("worker", f"{r.prefix}worker", env)
            wait_until(lambda: Execution.objects.filter(id__in=exiting + ordinary, status__in=[
                "completed", "failed", "stuck", "cancelled"]).count() == 2 * n, "the queue to run dry", r.bound,
                [worker])
            verdict.add("stuck", "stuck:worker-died", int(not worker.alive()))
            worker.terminate(60)
    finally:
        forget(QUEUE)
    rows = {eid: (status, error, recoveries) for eid, status, error, recoveries in
            Execution.objects.filter(id__in=exiting).values_list("id", "status", "error", "recoveries")}
    verdict.add("stuck", "stuck:exit-not-failed", sum(1 for eid in exiting if eid not in rows
                                                       or rows[eid][0] != "failed" or "SystemExit" not in rows[eid][1]))
    verdict.add("duplicated", "duplicated:exit-recovered", sum(1 for eid in rows if rows[eid][2] > 0))
    verdict.executions(f"{r.prefix}q", ordinary, steps)
    return verdict
