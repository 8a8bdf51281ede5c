"""A flow or step that raises SystemExit, KeyboardInterrupt or any BaseException (a task calling sys.exit(),
argparse's error()) fails that attempt, recorded with its class and traceback, under the retry policy: before,
it unwound the run with nothing settled, recovery re-ran it until it was marked stuck with no error recorded,
and its queue slot stayed taken (issue #35). A Halt (the runtime's own unwinding) is still not a failure.
SQLite and PostgreSQL; the worker tests need PostgreSQL."""

from __future__ import annotations

import json

import pytest

from journal.flows import load_state, resume, start
from journal.flows import ownership as own
from journal.models import Event, Execution
from tests.fixtures import exit_flows, flows_fixtures

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _flows(settings):
    settings.LOOM_FLOW_MODULES = ["tests.fixtures.exit_flows"]
    exit_flows.CALLS.clear()
    exit_flows.CRASH = False
    installed = own.get_ownership()
    own.set_ownership(None)  # the runtime's semantics; the worker tests below run real leases
    yield
    own.set_ownership(installed)


def payloads(execution_id: str, type_: str) -> list[dict]:
    return [e.payload for e in Event.objects.read(execution_id) if e.type == type_]


def test_a_step_calling_sys_exit_fails_its_flow_with_the_class_and_traceback_recorded():
    outcome = start("exits.step_exit", {"code": 3}, execution_id="exit-1")
    assert (outcome.status, outcome.error) == ("failed", "StepFailed: step 'exit' (position 1) failed after "
                                                         "1 attempt(s): SystemExit: 3")
    [failed] = payloads("exit-1", "STEP_FAILED")
    assert failed["error"] == "SystemExit: 3" and failed["retry"] is False
    assert "SystemExit: 3" in failed["traceback"] and "Traceback (most recent call last)" in failed["traceback"]
    assert Execution.objects.get(pk="exit-1").status == "failed"
    assert load_state("exit-1").steps[0][2] == 1  # the step before it completed and stays recorded


def test_argparse_error_in_a_step_is_a_failure_not_an_exit():
    outcome = start("exits.argparse", {"argv": ["--count", "many"]}, execution_id="exit-2")
    assert outcome.status == "failed" and outcome.error.endswith("SystemExit: 2")
    # ... and a good argument list completes (the step itself is fine)
    assert start("exits.argparse", {"argv": ["--count", "7"]}, execution_id="exit-3").result == {"count": 7}


def test_keyboard_interrupt_raised_by_the_flow_itself_fails_the_execution():
    outcome = start("exits.interrupt", {}, execution_id="exit-4")
    assert (outcome.status, outcome.error) == ("failed", "KeyboardInterrupt: the flow interrupted itself")
    [failed] = payloads("exit-4", "EXECUTION_FAILED")
    assert "raise KeyboardInterrupt" in failed["traceback"]
    assert Execution.objects.get(pk="exit-4").error == "KeyboardInterrupt: the flow interrupted itself"


def test_a_policy_that_retries_system_exit_runs_the_next_attempt():
    outcome = start("exits.retried", {}, execution_id="exit-5")
    assert (outcome.status, outcome.result) == ("completed", 2)
    [failed] = payloads("exit-5", "STEP_FAILED")
    assert (failed["attempt"], failed["retry"], failed["error"]) == (1, True, "SystemExit: first attempt exits")


def test_a_recovered_run_whose_step_exits_fails_instead_of_unwinding_the_resume():
    exit_flows.CRASH = True
    with pytest.raises(flows_fixtures.Crash):  # a Halt: not a failure, nothing settles
        start("exits.crash_then_exit", {}, execution_id="exit-6")
    assert Execution.objects.get(pk="exit-6").status == "running"
    assert payloads("exit-6", "STEP_FAILED") == []
    exit_flows.CRASH = False
    outcome = resume("exit-6", force=True)
    assert outcome.status == "failed" and outcome.error.endswith("SystemExit: 4")
    assert Execution.objects.get(pk="exit-6").status == "failed"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_worker_survives_exits_and_its_cap_one_queue_goes_on(child_env, tmp_path):
    """A real loom_worker: a queued flow calling sys.exit() on a queue of concurrency 1 fails once (no
    recovery, no stuck), the entries behind it run, a woken run that exits fails too, the worker lives."""
    from queues import declare_queue, enqueue
    from queues.declarations import forget
    from tests.leases.test_worker_processes import cleanup, output, spawn_worker, wait_until

    child_env.update({
        "LOOM_LEASE_TTL": "1.0", "LOOM_LEASE_RENEW_EVERY": "0.2", "LOOM_LEASE_LAZY_GRACE": "0.2",
        "LOOM_RECOVERY_EVERY": "0.2", "LOOM_FLOW_MODULES": "tests.fixtures.exit_flows", "LOOM_LEASE_MODE": "lazy",
        "LOOM_QUEUES": json.dumps({"t-exits": {"concurrency": 1}}), "LOOM_QUEUE_THREADS": "2",
        "LOOM_QUEUE_POLL": "0.02", "LOOM_WAIT_POLL": "0.2", "LOOM_TEST_LOGS": str(tmp_path),
    })
    declare_queue("t-exits", concurrency=1)
    own.set_ownership(None)
    enqueue("exits.step_exit", {"code": 3}, queue="t-exits", execution_id="qexit-0")
    for n in range(1, 4):
        enqueue("exits.then_ok", {"n": n}, queue="t-exits", execution_id=f"qexit-{n}")
    start("exits.sleep_then_exit", {"seconds": 1.5}, execution_id="wexit-0")  # parks; the worker's waker runs it
    worker = spawn_worker(child_env, "exits-w0")
    try:
        settled = ("completed", "failed", "stuck", "cancelled")
        wait_until(lambda: Execution.objects.filter(pk__in=["qexit-0", "qexit-1", "qexit-2", "qexit-3", "wexit-0"],
                                                    status__in=settled).count() == 5,
                   "every execution settled", timeout=60, proc=worker)
        assert worker.poll() is None, output(worker)
    finally:
        cleanup(worker)
        forget("t-exits")
    rows = {e.pk: (e.status, e.error, e.recoveries) for e in Execution.objects.filter(pk__startswith="qexit-")}
    rows["wexit-0"] = (lambda e: (e.status, e.error, e.recoveries))(Execution.objects.get(pk="wexit-0"))
    assert rows["qexit-0"][0] == "failed" and rows["qexit-0"][1].endswith("SystemExit: 3"), rows
    assert rows["wexit-0"][0] == "failed" and rows["wexit-0"][1].endswith("SystemExit: 5"), rows
    assert [rows[f"qexit-{n}"][0] for n in range(1, 4)] == ["completed"] * 3, rows
    assert all(recoveries == 0 for _, _, recoveries in rows.values()), rows  # failed once, never re-run
