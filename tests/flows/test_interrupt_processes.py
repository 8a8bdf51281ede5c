"""Interruptible steps with real `loom_worker` processes on PostgreSQL: a step's timeout reaches it while it
runs (told at its heartbeat; abandoned, and the worker replaced, when it ignores it), and a heartbeat timeout
hands a silent step's lease back so that it is taken over. The lease TTL (120 s) is longer than every bounded
wait here: nothing below can come from a lease that lapsed."""

from __future__ import annotations

import json
import socket
import uuid

import pytest

from journal.flows import events as ev
from journal.models import Event, Execution
from queues import declare_queue, enqueue
from tests.leases.test_shutdown_processes import QUEUE, TTL, spawn, terminate
from tests.leases.test_worker_processes import cleanup, output, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True, scope="module")
def stop_the_process_lease_keeper():
    yield
    from leases.keeper import get_keeper, reset_keeper

    get_keeper().shutdown()
    reset_keeper(None)


@pytest.fixture
def env(child_env, tmp_path):
    child_env.update({
        "LOOM_LEASE_TTL": str(TTL), "LOOM_LEASE_RENEW_EVERY": "0.5", "LOOM_LEASE_LAZY_GRACE": "0.2",
        "LOOM_RECOVERY_EVERY": "0.2", "LOOM_SHUTDOWN_GRACE": "3", "LOOM_STEP_ABANDON_AFTER": "1",
        "LOOM_FLOW_MODULES": "tests.fixtures.shutdown_flows", "LOOM_LEASE_MODE": "lazy",
        "LOOM_QUEUES": json.dumps({QUEUE: {"concurrency": 50}}), "LOOM_QUEUE_THREADS": "2",
        "LOOM_QUEUE_POLL": "0.05", "LOOM_TEST_LOGS": str(tmp_path), "PYTHONFAULTHANDLER": "1",
    })
    declare_queue(QUEUE, concurrency=50)
    return child_env


def status(eid: str) -> str | None:
    return Execution.objects.filter(pk=eid).values_list("status", flat=True).first()


def test_a_step_that_heartbeats_is_told_of_its_timeout_and_the_attempt_fails_as_timed_out(env):
    """A step of timeout 1 s that would work a minute, heartbeating: its heartbeat raises once the timeout
    passed, the attempt is recorded timed out, and the execution fails with it, long before the minute."""
    eid = f"patient-{uuid.uuid4().hex[:6]}"
    enqueue("shutdown.patient", {"timeout": 1.0}, queue=QUEUE, execution_id=eid)
    proc = spawn(env, "iw-patient", "--no-cluster")
    try:
        wait_until(lambda: status(eid) == "failed", "the step is told of its timeout", timeout=40, proc=proc)
    finally:
        terminate(proc)
        cleanup(proc)
    failed = [e.payload for e in Event.objects.read(eid) if e.type == ev.STEP_FAILED]
    assert len(failed) == 1 and failed[0]["timeout"] is True, failed
    assert "ran past its timeout" in failed[0]["error"]
    assert not [e for e in Event.objects.read(eid) if e.type == ev.STEP_COMPLETED]


def test_a_step_that_ignores_its_timeout_is_abandoned_and_its_worker_replaced(env):
    """A step of timeout 1 s blocked on a socket that never answers: told at its timeout, it ignores it; after
    LOOM_STEP_ABANDON_AFTER its thread is abandoned and the worker retires (every lease handed back) and replaces
    itself; the new process recovers the execution and records the attempt as timed out, never completed."""
    eid = f"ignores-{uuid.uuid4().hex[:6]}"
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)  # never accepted, never answered
        enqueue("shutdown.hang", {"port": server.getsockname()[1], "timeout": 1.0}, queue=QUEUE, execution_id=eid)
        proc = spawn(env, "iw-ignores", "--no-cluster")
        try:
            wait_until(lambda: status(eid) == "failed", "the abandoned step is recorded as timed out", timeout=60,
                       proc=proc)
            log = output(proc)
        finally:
            terminate(proc)
            cleanup(proc)
    assert f"abandoned execution={eid}" in log, log
    assert "replacing the process" in log and log.count("running (") >= 2, log
    failed = [e.payload for e in Event.objects.read(eid) if e.type == ev.STEP_FAILED]
    assert len(failed) == 1 and failed[0]["timeout"] is True, failed
    assert not [e for e in Event.objects.read(eid) if e.type == ev.STEP_COMPLETED]


def test_a_heartbeat_timeout_hands_the_silent_steps_lease_back_and_it_is_taken_over(env, tmp_path):
    """Two workers; a step with heartbeat_timeout 1 s hangs silently in whichever runs it first (it never
    returns there: the test ends before LOOM_STEP_ABANDON_AFTER). Its watchdog hands its lease back, a sweep
    takes the execution over and runs the step again, which completes: with a 120 s TTL, no expiry did it."""
    eid = f"silent-{uuid.uuid4().hex[:6]}"
    marker = tmp_path / "hung-pid"
    slow = {**env, "LOOM_STEP_ABANDON_AFTER": "600"}
    enqueue("shutdown.silent", {"marker": str(marker), "heartbeat_timeout": 1.0}, queue=QUEUE, execution_id=eid)
    procs = [spawn(slow, f"iw-silent-{n}", "--no-cluster") for n in range(2)]
    try:
        wait_until(lambda: status(eid) == "completed", "the silent step is taken over", timeout=60, proc=procs[0])
        logs = "\n".join(output(proc) for proc in procs)
    finally:
        for proc in procs:
            cleanup(proc)  # SIGKILL: one of them still has the hung thread
    assert f"heartbeat timeout execution={eid}" in logs, logs
    assert f"takeover execution={eid}" in logs, logs
    started = [e.payload for e in Event.objects.read(eid) if e.type == ev.STEP_STARTED]
    assert len(started) == 2 and started[1].get("recovered_by"), started
