"""A long-lived flow outlives more rolling deploys than LOOM_RECOVERY_MAX_ATTEMPTS allows recoveries: a takeover of
a lease handed back by a graceful shutdown is no recovery attempt (docs/leases.md "Takeover and the recovery
sweep"). Real `loom_worker` processes, on either database; the harness is tests/leases/test_shutdown_processes.py's.

The lease TTL is 120 s, longer than the test: every takeover is of a lease a stopping worker handed back."""

from __future__ import annotations

import re
import uuid

import pytest

from journal.flows import events as ev
from journal.models import Event, Execution
from queues import declare_queue, enqueue
from tests.fixtures.shutdown_flows import create_effects_table, effect_counts
from tests.leases.test_shutdown_processes import QUEUE, TTL, spawn, terminate, worker_env
from tests.leases.test_worker_processes import cleanup, output, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

DEPLOYS = 6  # one more than the default LOOM_RECOVERY_MAX_ATTEMPTS (5)


@pytest.fixture(autouse=True, scope="module")
def stop_the_process_lease_keeper():
    yield
    from leases.keeper import get_keeper, reset_keeper

    get_keeper().shutdown()
    reset_keeper(None)


@pytest.fixture
def env(child_env, tmp_path):
    """The shutdown tests' workers, with the DEFAULT LOOM_RECOVERY_MAX_ATTEMPTS."""
    return worker_env(child_env, tmp_path)


def test_a_flow_outlives_more_rolling_deploys_than_the_recovery_attempts_and_completes(env):
    """One flow of 10 steps of 0.5 s (each step's effect committed as it begins); its worker gets SIGTERM while
    it runs a step, exits 0 and is started again, 6 times. Each new worker takes the handed-back lease over and
    goes on from the next step: the execution completes (before: stuck at the 6th takeover), no step's effect
    twice, none lost, each position started once, and its recoveries figure is still 0."""
    from journal.conf import get as setting

    assert "LOOM_RECOVERY_MAX_ATTEMPTS" not in env and setting("LOOM_RECOVERY_MAX_ATTEMPTS") == DEPLOYS - 1
    create_effects_table()
    eid = f"deploys-{uuid.uuid4().hex[:6]}"
    steps = 10
    declare_queue(QUEUE, concurrency=50)
    enqueue("shutdown.steps", {"n": steps, "pause": 0.5}, queue=QUEUE, execution_id=eid)
    proc = spawn(env, "rd", "--no-cluster")
    every = [proc]
    try:
        for deploy in range(DEPLOYS):
            done = len(effect_counts(eid))
            # The worker runs a step it did not run before (the first, or the one after the last hand-back).
            wait_until(lambda done=done: len(effect_counts(eid)) > done, f"deploy {deploy}: a new step runs",
                       timeout=60, proc=proc)
            assert terminate(proc) == 0, output(proc)
            execution = Execution.objects.get(pk=eid)
            assert execution.status == "running", (deploy, execution.status, execution.error)
            proc = spawn(env, "rd", "--no-cluster")
            every.append(proc)
        wait_until(lambda: Execution.objects.get(pk=eid).status != "running", "the execution settles",
                   timeout=TTL * 0.5, proc=proc)
    finally:
        if proc.poll() is None:
            terminate(proc)
        logs = "\n".join(output(p) for p in every)
        for p in every:
            cleanup(p)
    execution = Execution.objects.get(pk=eid)
    assert (execution.status, execution.result, execution.error) == ("completed", steps, ""), logs
    assert execution.recoveries == 0
    assert effect_counts(eid) == {(eid, f"s{i}"): 1 for i in range(steps)}
    started = [e.payload["pos"] for e in Event.objects.read(eid) if e.type == ev.STEP_STARTED]
    assert started == list(range(steps)), started
    handed = re.findall(rf"lease handed back execution={eid} ", logs)
    taken = re.findall(rf"takeover execution={eid} .*", logs)
    assert len(handed) >= DEPLOYS and len(taken) >= DEPLOYS, logs
    assert all("handed back (no recovery attempt)" in line for line in taken), taken
