"""kill-mid-step: SIGKILL of a process running durable flows, inside a step, two ways.

1. A process running executions on its own threads kills itself inside a random step, after the
   step's effect was written and before the step was recorded (an atomic step: one transaction);
   a `loom_worker` recovers every execution it had started once their leases expire.
2. `loom_worker` (with its django-q2 cluster) runs queued starts (`leases.tasks.enqueue_start`: queued
   executions on the default queue, run by its dispatcher's threads since issue #24) and its main
   process is SIGKILLed at a random moment while runs are inside steps.
   Whatever of its process group is still alive 1 s later is an orphan (docs/workers.md: a SIGKILL
   leaves nothing behind); orphans are then killed, and a fresh `loom_worker` must run every queued
   start, taken or not, within the recovery bound (about a lease TTL, not the broker's retry timeout).

Invariants: every execution completed; every step's effect exactly once; no lease left; no orphan.
"""

from __future__ import annotations

import time

from benchmarks.faults.base import Round, Verdict
from benchmarks.faults.fixtures import EFFECTS
from benchmarks.faults.processes import group_members, wait_until
from journal.models import Execution

NAME = "kill-mid-step"
POSTGRES_ONLY = True
PAUSE = 0.1  # seconds per step: the kill lands inside one


def _completed(ids: list[str]) -> bool:
    return Execution.objects.filter(id__in=ids, status="completed").count() == len(ids)


def _effects(prefix: str) -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {EFFECTS} WHERE execution_id LIKE %s", [prefix + "%"])
        return cursor.fetchone()[0]


def _stop(worker, verdict: Verdict) -> None:
    """SIGTERM a worker; it must stop by itself (and leave no process of its group behind)."""
    try:
        code = worker.terminate(60)
    except AssertionError:
        verdict.add("stuck", "stuck:worker-did-not-stop", 1)
        return
    if code != 0:
        raise AssertionError(f"{worker.name} exited with {code} on SIGTERM:\n{worker.tail()}")


def run(r: Round) -> Verdict:
    from leases.tasks import enqueue_start

    n, steps = r.opt("executions"), r.opt("steps")
    own_kill = r.rng.randint(1, max(1, n * steps // 2))
    queued_kill = r.rng.randint(1, max(1, n * steps // 2))
    r.params.update(executions=4 * n, steps=steps, kill_own_after_steps=own_kill,
                    kill_worker_after_effects=queued_kill)
    verdict = r.verdict
    value = {"n": steps, "pause": PAUSE}
    own = [f"{r.prefix}x{i}" for i in range(n)]
    queued = [f"{r.prefix}q{i}" for i in range(3 * n)]  # more than the cluster takes before the kill
    with r.pool() as pool:
        # 1. a process kills itself inside a step; a worker recovers what it started.
        runner = pool.role("runner", "flows", {"wid": f"{r.prefix}runner", "ids": own, "flow": "faults.steps",
                                               "input": value, "threads": 2},
                           r.env(FAULTS_KILL_POINT="step", FAULTS_KILL_AFTER=str(own_kill)))
        wait_until(lambda: not runner.alive(), "the runner to die at its kill point", r.bound)
        if runner.alive():
            runner.kill()
        verdict.note("died-at-kill-point", int(runner.proc.returncode == -9))
        started = list(Execution.objects.filter(id__in=own).values_list("id", flat=True))
        rescuer = pool.worker("rescuer", f"{r.prefix}rescuer", r.env())
        t0 = time.monotonic()
        wait_until(lambda: _completed(started), "the rescuer to finish", r.bound, [rescuer])
        r.figures["recovered_seconds"] = round(time.monotonic() - t0, 2)
        _stop(rescuer, verdict)

        # 2. loom_worker with its cluster, SIGKILLed while its processes run queued starts.
        worker = pool.worker("cluster", f"{r.prefix}cluster", r.env(), cluster=True)
        for eid in queued:
            enqueue_start("faults.steps", value, execution_id=eid)
        wait_until(lambda: _effects(f"{r.prefix}q") >= queued_kill, "the cluster to run steps", r.bound, [worker])
        worker.kill()
        time.sleep(1.0)
        orphans = group_members(worker.pid)
        verdict.add("stuck", "stuck:orphan-processes", len(orphans))
        worker.ensure_dead()  # what the orphans held is now as good as a killed cluster's
        fresh = pool.worker("fresh", f"{r.prefix}fresh", r.env(), cluster=True)
        t0 = time.monotonic()
        wait_until(lambda: _completed(queued), "the fresh worker to run every queued start", r.bound, [fresh])
        r.figures["queued_recovered_seconds"] = round(time.monotonic() - t0, 2)
        _stop(fresh, verdict)
        verdict.add("stuck", "stuck:orphan-processes", len(group_members(fresh.pid)))
    verdict.executions(r.prefix, started + queued, steps)
    return verdict
