"""zombie-owner: the process driving an execution (eager lease, heartbeat only) is SIGSTOPped inside
a random step, past the lease TTL; a `loom_worker` takes the execution over and finishes it; then the
zombie is woken with SIGCONT. It must be refused: its step's completion, and a late append with its
old fence token.

Invariants: the execution completed once, by the worker; every step's effect exactly once (the
zombie's step rolled back with its refused completion); no late write stored; no lease left."""

from __future__ import annotations

import signal

from benchmarks.faults.base import Round, Verdict
from benchmarks.faults.processes import TTL, wait_until
from journal.models import Event, Execution
from leases.models import Lease

NAME = "zombie-owner"
POSTGRES_ONLY = True


def run(r: Round) -> Verdict:
    steps = r.opt("steps")
    at = r.rng.randrange(steps)
    eid = f"{r.prefix}zombie"
    marker, release = r.folder / "running", r.folder / "release"
    r.params.update(steps=steps, stopped_in_step=at)
    verdict = r.verdict
    value = {"n": steps, "at": at, "marker": str(marker), "release": str(release)}
    with r.pool() as pool:
        zombie = pool.role("zombie", "hold", {"wid": f"{r.prefix}A", "id": eid, "input": value},
                           r.env(LOOM_LEASE_MODE="eager"))
        if not wait_until(lambda: (r.folder / f"running.{zombie.pid}").exists()
                          and Lease.objects.filter(execution_id=eid).exists(), "the zombie to hold its step", 60,
                          [zombie]):
            raise AssertionError(f"the zombie never reached step {at} holding a lease:\n{zombie.tail()}")
        zombie.signal(signal.SIGSTOP)
        rescuer = pool.worker("rescuer", f"{r.prefix}B", r.env())
        took = wait_until(lambda: (r.folder / f"running.{rescuer.pid}").exists(), "the worker to take over",
                          r.bound + TTL, [rescuer])
        release.touch()
        done = took and wait_until(lambda: Execution.objects.filter(id=eid, status="completed").exists(),
                                   "the worker to finish", r.bound, [rescuer])
        zombie.signal(signal.SIGCONT)
        zombie.wait(60)
        rescuer.terminate(60)
    said = zombie.lines()
    verdict.add("duplicated", "duplicated:zombie-late-write-accepted",
                int(["LATE", "APPENDED"] in said) + Event.objects.filter(stream_id=eid, type="LATE_WRITE").count())
    completed = any(p[:1] == ["OUTCOME"] and p[-1] == "completed" for p in said)
    verdict.add("duplicated", "duplicated:zombie-completed", int(completed))
    verdict.note("zombie-halted", int(any(p[:1] == ["HALTED"] for p in said)))
    if not done:
        verdict.note("worker-did-not-finish", 1)
    verdict.executions(r.prefix, [eid], steps)
    return verdict
