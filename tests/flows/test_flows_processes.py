"""Durable flows across real processes: a SIGKILLed worker's execution is resumed elsewhere with
every completed step's effect exactly once; a stale owner is refused after a takeover; two
processes racing to start one caller-chosen id produce exactly one execution. SQLite and PostgreSQL."""

from __future__ import annotations

import os
import signal
import time

import pytest

from journal.models import Event, Execution, Fence
from tests.conftest import effect_rows, run_child, spawn_child

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def env(settings, child_env):
    settings.LOOM_FLOW_MODULES = ["tests.fixtures.flows_fixtures"]
    child_env["LOOM_FLOW_MODULES"] = "tests.fixtures.flows_fixtures"
    child_env["LOOM_LEASE_MODE"] = "off"  # explicit resume here; leases are tested in their own suite
    return child_env


def wait_for(path, proc, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if proc.poll() is not None:
            raise AssertionError(f"child exited early ({proc.returncode}): {proc.communicate()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"child never reached {path}")
        time.sleep(0.02)


def test_worker_killed_mid_step_is_resumed_by_another_process_exactly_once(env, effects, tmp_path):
    """SIGKILL in the middle of an atomic step: resume elsewhere finishes; each step's effect once, log contiguous."""
    marker = str(tmp_path / "in-step-two")
    worker = spawn_child(f"from journal.flows import start\nstart('test.effects', {{'marker': {marker!r}}}, "
                         f"execution_id='crash-1')", env)
    try:
        wait_for(marker, worker)  # step two has written its effect (uncommitted) and hangs
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
        worker.communicate()
    assert worker.returncode == -signal.SIGKILL
    assert Execution.objects.get(pk="crash-1").status == "running"
    assert effect_rows() == [("crash-1", "one")]

    proc = run_child("from journal.flows import resume\nprint(resume('crash-1'))", env)
    assert "status='completed', result='done'" in proc.stdout
    assert effect_rows() == [("crash-1", "one"), ("crash-1", "two"), ("crash-1", "three")]
    events = Event.objects.read("crash-1")
    assert [e.seq for e in events] == list(range(len(events)))
    assert [e.type for e in events] == ["EXECUTION_STARTED", "STEP_STARTED", "STEP_COMPLETED", "STEP_STARTED",
                                        "STEP_STARTED", "STEP_COMPLETED", "STEP_STARTED", "STEP_COMPLETED",
                                        "EXECUTION_COMPLETED"]
    header = Execution.objects.get(pk="crash-1")
    assert (header.status, header.result) == ("completed", "done")
    assert Fence.objects.current("crash-1") == 2


def test_stale_owner_is_refused_after_resume_took_over(env, tmp_path):
    """The first owner, still alive mid-step, cannot write once a resume took a new fence; it stops."""
    marker, release = str(tmp_path / "in-step"), str(tmp_path / "release")
    value = {"marker": marker, "release": release}
    owner = spawn_child(
        "from journal.flows import start, OwnershipLost\n"
        f"try:\n    print(start('test.blocking', {value!r}, execution_id='stale-1'))\n"
        "except OwnershipLost as exc:\n    print('LOST', exc)\n", env)
    try:
        wait_for(marker, owner)
        proc = run_child("from journal.flows import resume\nprint(resume('stale-1'))", env)
        assert "status='completed', result='finished'" in proc.stdout
        tip = Event.objects.tip("stale-1")
        open(release, "w").close()
        out, err = owner.communicate(timeout=60)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.communicate()
    assert owner.returncode == 0, err
    assert "LOST" in out and "stale fence" in out
    assert Event.objects.tip("stale-1") == tip  # the old owner wrote nothing
    types = [e.type for e in Event.objects.read("stale-1")]
    assert types.count("EXECUTION_COMPLETED") == 1 and types[-1] == "EXECUTION_COMPLETED"
    assert Execution.objects.get(pk="stale-1").status == "completed"


def test_two_processes_racing_to_start_one_id_produce_exactly_one_execution(env, effects, tmp_path):
    """Exactly one start wins; the other gets ExecutionExists before any step; one EXECUTION_STARTED."""
    go = str(tmp_path / "go")
    code = (
        "import os, time\nfrom journal.flows import start, ExecutionExists\n"
        f"while not os.path.exists({go!r}):\n    time.sleep(0.005)\n"
        "try:\n    print('WON', start('test.once', {}, execution_id='race-1').status)\n"
        "except ExecutionExists as exc:\n    print('EXISTS', exc.status)\n"
    )
    procs = [spawn_child(code, env) for _ in range(2)]
    try:
        time.sleep(1.0)  # both interpreters set up and polling
        open(go, "w").close()
        outputs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert all(p.returncode == 0 for p in procs), outputs
    lines = sorted(out.strip() for out, _ in outputs)
    assert len([line for line in lines if line.startswith("WON completed")]) == 1, lines
    assert len([line for line in lines if line.startswith("EXISTS")]) == 1, lines
    assert [e.type for e in Event.objects.read("race-1")].count("EXECUTION_STARTED") == 1
    assert effect_rows() == [("race-1", "effect")]
    assert Execution.objects.filter(pk="race-1").count() == 1
