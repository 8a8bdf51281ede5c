"""Flows that wait, in one process (journal/flows/waits.py): durable sleep and timers, scheduled
starts, parked retry backoff, messages, events, suspend/resume, children, continue-as-new, deadlines,
fork, and the bad-input refusals. SQLite and PostgreSQL. Waits are forced to park
(LOOM_WAIT_INLINE_MAX=0); `wake_due()` plays the worker's waker in this thread."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from journal.flows import (
    ExecutionFinished,
    InvalidInput,
    UnknownExecution,
    cancel,
    fork,
    get_event,
    resume,
    send,
    start,
    suspend,
    waiting_on,
    wake_due,
    wake_now,
)
from journal.flows import events as ev
from journal.flows import ownership as own
from journal.models import Event, Execution, FlowEvent, Message, Wait
from journal.store import store_for
from tests.conftest import effect_rows
from tests.fixtures import waits_flows as wf

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _flows(settings, effects):
    settings.LOOM_FLOW_MODULES = ["tests.fixtures.waits_flows"]
    settings.LOOM_SNAPSHOT_EVERY = None
    settings.LOOM_WAIT_INLINE_MAX = 0.0
    settings.LOOM_WAIT_POLL = 0.05
    wf.FAIL_TIMES.clear()
    installed = own.get_ownership()
    own.set_ownership(None)
    yield
    own.set_ownership(installed)


def types(execution_id: str) -> list[str]:
    return [e.type for e in Event.objects.read(execution_id)]


def status(execution_id: str) -> str:
    return Execution.objects.get(pk=execution_id).status


def ran(execution_id: str) -> list[str]:
    return [step for eid, step in effect_rows() if eid == execution_id]


def wake_until(execution_id: str, wanted=("completed", "failed", "cancelled"), limit: float = 20.0) -> str:
    """Run the waker here until the execution reaches one of `wanted` (a bound, not a timing claim)."""
    give_up = time.monotonic() + limit
    while time.monotonic() < give_up:
        wake_due()
        if status(execution_id) in wanted:
            return status(execution_id)
        time.sleep(0.02)
    raise AssertionError(f"{execution_id} still {status(execution_id)}")


# -- durable sleep ---------------------------------------------------------------------------------
def test_a_long_sleep_parks_with_its_due_time_in_the_log_and_a_wait_row():
    outcome = start("waits.sleeper", {"seconds": 3600}, execution_id="s1")
    assert outcome.status == "waiting" and outcome.parked
    assert status("s1") == "waiting"
    wait = waiting_on("s1")
    assert wait["kind"] == "sleep" and wait["pos"] == 1 and wait["token"] == 1
    started = next(e for e in Event.objects.read("s1") if e.type == ev.WAIT_STARTED)
    due = timezone.datetime.fromisoformat(started.payload["due_at"])
    assert wait["due_at"] == due
    assert due - timezone.now() > timedelta(seconds=3500)
    assert wake_due() == []  # not due: nothing claimed, nothing run
    assert ran("s1") == ["before"] and status("s1") == "waiting"


def test_a_due_sleep_is_woken_runs_the_rest_once_and_never_sleeps_again():
    start("waits.sleeper", {"seconds": 0.2}, execution_id="s2")
    assert wake_until("s2") == "completed"
    assert ran("s2") == ["before", "after"]
    assert types("s2").count(ev.WAIT_STARTED) == 1
    assert Wait.objects.filter(execution_id="s2").count() == 0
    # A replay of the completed log returns its outcome, writes nothing.
    count = len(types("s2"))
    assert resume("s2").status == "completed" and len(types("s2")) == count


def test_a_replay_after_the_due_time_does_not_park_again():
    """The waker claimed the row and died before running it: a resume finds the recorded due time
    passed and goes on at once (one WAIT_STARTED, one 'after')."""
    start("waits.sleeper", {"seconds": 0.2}, execution_id="s3")
    store = store_for()
    give_up = time.monotonic() + 20
    claimed = []
    while not claimed and time.monotonic() < give_up:
        claimed = store.claim_due_waits(timezone.now(), 10, None)
        time.sleep(0.02)
    assert [c.execution_id for c in claimed] == ["s3"] and status("s3") == "running"
    assert resume("s3").status == "completed"
    assert types("s3").count(ev.WAIT_STARTED) == 1 and ran("s3") == ["before", "after"]


def test_wake_now_ends_a_sleep_early_and_records_who():
    start("waits.sleeper", {"seconds": 3600}, execution_id="s4")
    assert wake_now("s4") is True
    assert ev.WAIT_WOKEN in types("s4")
    assert [o.status for o in wake_due()] == ["completed"]
    assert ran("s4") == ["before", "after"]
    with pytest.raises(ExecutionFinished):
        wake_now("s4")


def test_sleep_until_a_past_time_goes_straight_on():
    when = (timezone.now() - timedelta(seconds=5)).isoformat()
    assert start("waits.until", {"when": when}, execution_id="u1").status == "completed"


def test_a_short_sleep_below_the_inline_limit_sleeps_in_the_thread(settings):
    settings.LOOM_WAIT_INLINE_MAX = 5.0
    outcome = start("waits.sleeper", {"seconds": 0.01}, execution_id="s5")
    assert outcome.status == "completed" and types("s5").count(ev.WAIT_STARTED) == 1


def test_a_scheduled_start_waits_until_due_then_runs():
    outcome = start("waits.steps", {"n": 2}, execution_id="sched1", delay=3600)
    assert outcome.status == "waiting" and waiting_on("sched1")["kind"] == "start"
    assert ran("sched1") == [] and wake_due() == []
    assert wake_now("sched1") is True
    assert [o.status for o in wake_due()] == ["completed"]
    assert ran("sched1") == ["s0-", "s1-"]


def test_a_start_at_in_the_past_is_due_at_once():
    start("waits.steps", {"n": 1}, execution_id="sched2", start_at=timezone.now() - timedelta(seconds=1))
    assert wake_until("sched2") == "completed"


def test_a_long_retry_backoff_parks_on_a_timer():
    wf.FAIL_TIMES["r1"] = 1
    outcome = start("waits.flaky", {}, execution_id="r1")
    assert outcome.status == "waiting" and waiting_on("r1")["kind"] == "retry"
    assert ran("r1") == ["attempt"]
    assert wake_now("r1") is True
    assert [o.status for o in wake_due()] == ["completed"]
    assert ran("r1") == ["attempt", "attempt"]


# -- messages --------------------------------------------------------------------------------------
def test_a_message_sent_before_the_flow_waits_is_kept_and_consumed_once():
    start("waits.receiver", {"topic": "go"}, execution_id="m0", delay=3600)
    assert send("m0", "go", {"x": 1}, message_id="k1") == "k1"
    assert send("m0", "go", {"x": 2}, message_id="k1") == "k1"  # idempotent: first write wins
    assert Message.objects.filter(execution_id="m0").count() == 1
    wake_now("m0")
    assert [o.result for o in wake_due()] == [{"x": 1}]
    msg = Message.objects.get(execution_id="m0")
    assert msg.consumed_at is not None and msg.consumed_seq is not None
    assert Event.objects.read("m0")[msg.consumed_seq].type == ev.STEP_COMPLETED


def test_send_wakes_a_waiting_recipient_at_once():
    assert start("waits.receiver", {"topic": "go"}, execution_id="m1").status == "waiting"
    assert waiting_on("m1")["due_at"] is None
    send("m1", "go", "hello")
    assert waiting_on("m1")["due_at"] is not None
    assert [o.result for o in wake_due()] == ["hello"]
    assert ran("m1") == ["after"]


def test_each_message_goes_to_one_recv_in_order():
    start("waits.two_messages", {}, execution_id="m2")
    send("m2", "t", "a")
    send("m2", "t", "b")
    assert wake_until("m2") == "completed"
    assert Execution.objects.get(pk="m2").result == ["a", "b"]
    assert Message.objects.filter(execution_id="m2", consumed_at__isnull=True).count() == 0


def test_recv_times_out_with_none():
    start("waits.receiver", {"topic": "go", "timeout": 0.2}, execution_id="m3")
    assert wake_until("m3") == "completed"
    assert Execution.objects.get(pk="m3").result is None


def test_a_message_to_another_topic_does_not_wake_it():
    start("waits.receiver", {"topic": "go"}, execution_id="m4")
    send("m4", "other", 1)
    assert waiting_on("m4")["due_at"] is None


# -- events ----------------------------------------------------------------------------------------
def test_set_event_is_read_by_get_event_and_not_set_twice_on_replay():
    start("waits.publisher", {}, execution_id="e1")
    assert get_event("e1", "stage") == "one"
    assert get_event("e1", "missing", default="none") == "none"
    send("e1", "next", 5)
    assert wake_until("e1") == "completed"
    assert get_event("e1", "stage", timeout=1) == {"got": 5}
    assert FlowEvent.objects.filter(execution_id="e1").count() == 1


def test_get_event_waits_up_to_its_timeout_and_returns_the_default():
    start("waits.receiver", {}, execution_id="e2")
    assert get_event("e2", "never", timeout=0.1, default=7) == 7


# -- suspend / resume ------------------------------------------------------------------------------
def test_suspend_parks_without_a_wait_and_resume_continues():
    start("waits.receiver", {"topic": "go"}, execution_id="p1")
    assert suspend("p1").status == "suspended"
    assert status("p1") == "suspended" and waiting_on("p1") is None
    assert ev.EXECUTION_SUSPENDED in types("p1")
    send("p1", "go", "later")  # kept for it
    assert wake_due() == []  # nothing wakes a suspended execution
    assert suspend("p1").status == "suspended"  # idempotent
    assert resume("p1").status == "completed"
    assert ev.EXECUTION_RESUMED in types("p1") and Execution.objects.get(pk="p1").result == "later"
    with pytest.raises(ExecutionFinished):
        suspend("p1")


def test_a_resumed_waiting_execution_is_running_while_it_runs_and_parks_again():
    start("waits.sleeper", {"seconds": 3600}, execution_id="p2")
    assert resume("p2").status == "waiting"
    assert status("p2") == "waiting" and waiting_on("p2")["token"] == 2


# -- children --------------------------------------------------------------------------------------
def test_a_child_runs_on_a_worker_and_its_completion_wakes_the_parent():
    assert start("waits.parent", {"n": 4}, execution_id="par1").status == "waiting"
    assert waiting_on("par1")["kind"] == "child"
    child_id = "par1.child-0"
    assert status(child_id) == "waiting"
    assert wake_until("par1") == "completed"
    assert Execution.objects.get(pk="par1").result == {"child": child_id, "result": 40}
    assert ran(child_id) == ["child-work"]
    assert Event.objects.read(child_id)[0].payload["$parent"] == "par1"


def test_a_failed_child_raises_child_failed_in_the_parent():
    start("waits.parent", {"n": 1, "fail": True}, execution_id="par2")
    assert wake_until("par2") == "failed"
    assert "ChildFailed" in Execution.objects.get(pk="par2").error


def test_a_replay_does_not_start_a_second_child():
    start("waits.parent", {"n": 2, "wait": True}, execution_id="par3")
    assert resume("par3").status == "waiting"
    assert Execution.objects.filter(pk__startswith="par3.").count() == 1


def test_cancelling_the_parent_cancels_its_children():
    start("waits.parent", {"n": 2, "wait": True}, execution_id="par4")
    wake_due()  # the child runs and waits for its message
    assert status("par4.child-0") == "waiting"
    assert cancel("par4").status == "cancelled"
    assert status("par4.child-0") == "cancelled"


# -- continue as new -------------------------------------------------------------------------------
def test_continue_as_new_links_fresh_logs():
    outcome = start("waits.counter", {"n": 0, "until": 3}, execution_id="c1")
    assert outcome.status == "completed" and outcome.result == {"continued_as": "c1~1"}
    assert ev.EXECUTION_CONTINUED in types("c1")
    assert wake_until("c1~1") == "completed"
    assert wake_until("c1~2") == "completed"
    assert Execution.objects.get(pk="c1~2").result == 3
    first = Event.objects.read("c1~2")[0].payload
    assert first["$previous"] == "c1~1" and first["$root"] == "c1"
    assert len(types("c1~2")) < 10


# -- deadlines -------------------------------------------------------------------------------------
def test_a_waiting_execution_fails_at_its_deadline():
    assert start("waits.deadline", {}, execution_id="d1", timeout=0.3).status == "waiting"
    assert waiting_on("d1")["due_at"] is not None  # woken at the deadline although recv has no timeout
    assert wake_until("d1") == "failed"
    assert "DeadlineExceeded" in Execution.objects.get(pk="d1").error


def test_a_step_past_its_timeout_fails():
    outcome = start("waits.slow_step", {"seconds": 0.05, "timeout": 0.0}, execution_id="d2")
    assert outcome.status == "failed" and "timeout" in outcome.error
    failed = [e.payload for e in Event.objects.read("d2") if e.type == ev.STEP_FAILED]
    assert failed and failed[0]["timeout"] is True


# -- fork ------------------------------------------------------------------------------------------
def test_fork_reuses_the_steps_before_n_and_runs_the_rest():
    start("waits.steps", {"n": 3, "tag": "a"}, execution_id="f1")
    new_id = fork("f1", from_step=2, execution_id_new="f1-fork")
    assert new_id == "f1-fork" and status("f1-fork") == "waiting"
    assert [o.status for o in wake_due()] == ["completed"]
    assert ran("f1-fork") == ["s2-a"]
    assert Execution.objects.get(pk="f1-fork").result == Execution.objects.get(pk="f1").result


# -- bad input: our errors, nothing written --------------------------------------------------------
def rows() -> tuple[int, int, int, int]:
    return Event.objects.count(), Message.objects.count(), Wait.objects.count(), Execution.objects.count()


def test_bad_input_is_refused_with_our_errors_and_writes_nothing():
    start("waits.receiver", {}, execution_id="b1")
    start("waits.steps", {"n": 1}, execution_id="b2")
    before = rows()
    with pytest.raises(UnknownExecution):
        send("nobody", "go", 1)
    with pytest.raises(ExecutionFinished):
        send("b2", "go", 1)
    with pytest.raises(InvalidInput):
        send("b1", "go", {1, 2})
    with pytest.raises(InvalidInput):
        send("b1", "", 1)
    with pytest.raises(InvalidInput):
        start("waits.sleeper", {}, delay=-1)
    with pytest.raises(InvalidInput):
        start("waits.sleeper", {}, delay=1, start_at=timezone.now())
    with pytest.raises(UnknownExecution):
        get_event("nobody", "k")
    with pytest.raises(UnknownExecution):
        suspend("nobody")
    with pytest.raises(InvalidInput):
        fork("b2", from_step=5)
    assert rows() == before


def test_a_negative_sleep_fails_the_flow_before_its_wait_is_written():
    outcome = start("waits.sleeper", {"seconds": -1}, execution_id="b3")
    assert outcome.status == "failed" and "InvalidInput" in outcome.error
    assert ev.WAIT_STARTED not in types("b3")


def test_describe_shows_a_wait_as_a_row_of_the_timeline():
    from journal.flows import describe

    start("waits.receiver", {"topic": "go"}, execution_id="t1")
    rows = describe("t1")["steps"]
    assert [(r["step"], r["status"]) for r in rows] == [("$recv:go", "waiting")]
    assert "message on 'go'" in rows[0]["note"]
    send("t1", "go", 1)
    wake_due()
    rows = describe("t1")["steps"]
    assert [(r["step"], r["status"], r["result"]) for r in rows] == [("$recv:go", "completed", 1),
                                                                     ("after", "completed", "after")]


def test_a_flow_may_handle_its_deadline_and_run_steps_after_it():
    assert start("waits.deadline_handler", {}, execution_id="d3", timeout=0.2).status == "waiting"
    assert wake_until("d3") == "completed"
    assert Execution.objects.get(pk="d3").result == "handled" and ran("d3") == ["compensate"]


def test_a_step_whose_run_died_past_its_timeout_fails_with_the_expiry_recorded():
    """Its worker died in the step; the resume after the step's deadline records the timeout (no
    retry policy: the step and the flow fail) instead of running it again."""
    from tests.fixtures.flows_fixtures import Crash

    wf.CRASH_IN_STEP = True
    try:
        with pytest.raises(Crash):
            start("waits.timed_crash", {"timeout": 0.0}, execution_id="d4")
    finally:
        wf.CRASH_IN_STEP = False
    outcome = resume("d4")
    assert outcome.status == "failed" and "ran past its timeout" in outcome.error
    failed = [e.payload for e in Event.objects.read("d4") if e.type == ev.STEP_FAILED]
    assert [(f["step"], f["timeout"]) for f in failed] == [("timed", True)]


def test_the_minute_backstop_of_qcluster_only_deployments_wakes_due_waits():
    from leases.tasks import wake_backstop

    start("waits.sleeper", {"seconds": 3600}, execution_id="bk-1")
    assert wake_backstop() == 0
    wake_now("bk-1")
    assert wake_backstop() == 1 and status("bk-1") == "completed"


@pytest.mark.parametrize("how", ["scheduled start", "retry backoff"])
def test_a_deadline_that_passes_before_the_wait_ends_fails_the_execution(how):
    """Woken at its deadline (before its start time, or in a long backoff), the execution fails
    instead of parking again."""
    if how == "scheduled start":
        outcome = start("waits.steps", {"n": 1}, execution_id="d5", delay=3600, timeout=0.2)
    else:
        wf.FAIL_TIMES["d5"] = 2
        outcome = start("waits.flaky", {}, execution_id="d5", timeout=0.2)
    assert outcome.status == "waiting"
    assert waiting_on("d5")["due_at"] < timezone.now() + timedelta(seconds=60)  # capped by the deadline
    assert wake_until("d5") == "failed"
    assert "deadline exceeded" in Execution.objects.get(pk="d5").error
