"""Continue-as-new chains and forks as other executions see them (journal/flows/waits.py): a parent
waits for the LAST run of a child's chain, cancel reaches the chain's current run, messages follow a
chain (carried over, and sends to an old id forwarded), a fork owns its children, a deadline bounds the
whole chain, and an operator's resume/suspend never fences off a run a waker just woke. Both backends;
`wake_due()` plays the worker's waker in this thread."""

from __future__ import annotations

import pytest
from django.utils import timezone

from journal.flows import (
    ExecutionBusy,
    InvalidInput,
    cancel,
    fork,
    get_event,
    resume,
    runtime,
    send,
    start,
    suspend,
    waits,
    wake_due,
    wake_now,
)
from journal.flows import ownership as own
from journal.models import Event, Execution, Message, Wait
from tests.conftest import effect_rows
from tests.fixtures import waits_flows as wf

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _flows(settings, effects):
    settings.LOOM_FLOW_MODULES = ["tests.fixtures.waits_flows"]
    settings.LOOM_SNAPSHOT_EVERY = None
    settings.LOOM_WAIT_INLINE_MAX = 0.0
    settings.LOOM_WAIT_POLL = 0.05
    installed = own.get_ownership()
    own.set_ownership(None)
    yield
    own.set_ownership(installed)


def status(execution_id: str) -> str:
    return Execution.objects.get(pk=execution_id).status


def drain(rounds: int = 30) -> None:
    """Run the waker here until nothing is due (a bound on rounds, not a timing claim)."""
    for _ in range(rounds):
        if not wake_due():
            return


# -- R1: a child that continues as new ------------------------------------------------------------
def test_a_parent_waits_for_the_last_run_of_its_childs_chain():
    start("waits.chain_parent", {"n": 0, "until": 2}, execution_id="cp1")
    drain()
    assert status("cp1.child-0") == "completed" and status("cp1.child-0~2") == "completed"
    assert status("cp1") == "completed"
    assert Execution.objects.get(pk="cp1").result == "final after 2"


def test_a_parent_stays_waiting_while_its_childs_chain_runs_and_wakes_at_its_end():
    start("waits.chain_parent", {"n": 0, "until": 1, "wait": True}, execution_id="cp2")
    drain()
    assert status("cp2.child-0") == "completed" and status("cp2.child-0~1") == "waiting"
    assert status("cp2") == "waiting"
    assert Wait.objects.get(pk="cp2").child == "cp2.child-0~1"  # it waits for the chain's current run
    send("cp2.child-0~1", "release", None)
    drain()
    assert status("cp2") == "completed" and Execution.objects.get(pk="cp2").result == "final after 1"


def test_cancelling_the_parent_reaches_the_current_run_of_its_childs_chain():
    start("waits.chain_parent", {"n": 0, "until": 1, "wait": True}, execution_id="cp3")
    drain()
    assert status("cp3.child-0~1") == "waiting"
    assert cancel("cp3").status == "cancelled"
    assert status("cp3.child-0~1") == "cancelled"


def test_a_deadline_bounds_the_whole_chain_not_only_its_first_run():
    start("waits.chain", {"n": 0, "until": 1, "wait": True}, execution_id="dl1", timeout=3600)
    drain()
    first = Event.objects.read("dl1")[0].payload
    assert Event.objects.read("dl1~1")[0].payload["$deadline"] == first["$deadline"]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_run_cancelled_while_it_continues_as_new_leaves_no_next_run(monkeypatch):
    """The cancel (another thread) is forced in just before the next run is written: the next run and
    the settle commit together or not at all, so no unowned next run is left running. (PostgreSQL: on
    SQLite the continuing transaction holds the write lock, so a cancel cannot come in between.)"""
    import threading

    from django.db import connections

    original = waits.continue_run

    def cancel_first(state, flow, value):
        def operator():
            try:
                cancel(state.execution_id, "while continuing")
            finally:
                connections.close_all()

        thread = threading.Thread(target=operator)
        thread.start()
        thread.join(30)
        return original(state, flow, value)

    monkeypatch.setattr(waits, "continue_run", cancel_first)
    outcome = start("waits.counter", {"n": 0, "until": 3}, execution_id="cc1")
    assert outcome.status == "cancelled"
    assert not Execution.objects.filter(pk="cc1~1").exists() and not Event.objects.filter(stream_id="cc1~1").exists()


# -- R4: messages across continue_as_new ----------------------------------------------------------
def test_unconsumed_messages_are_carried_to_the_next_run_and_consumed_once():
    start("waits.accumulator", 0, execution_id="acc1")
    for i, value in enumerate((1, 2, 3)):
        send("acc1", "add", value, message_id=f"m{i}")
    send("acc1", "add", "stop", message_id="m-stop")
    drain()
    assert status("acc1~3") == "completed" and Execution.objects.get(pk="acc1~3").result == 6
    assert Message.objects.filter(consumed_at__isnull=True).count() == 0
    assert sorted(Message.objects.values_list("message_id", flat=True)) == ["m-stop", "m0", "m1", "m2"]


def test_a_send_to_a_run_that_continued_goes_to_the_chains_current_run():
    start("waits.accumulator", 0, execution_id="acc2")
    send("acc2", "add", 5, message_id="a")
    drain()
    assert status("acc2") == "completed" and status("acc2~1") == "waiting"
    send("acc2", "add", 7, message_id="b")  # the id the caller knows keeps taking messages
    send("acc2", "add", "stop", message_id="c")
    drain()
    assert Execution.objects.get(pk="acc2~2").result == 12
    assert list(Message.objects.filter(message_id="b").values_list("execution_id", flat=True)) == ["acc2~1"]


def test_cancelling_a_run_that_continued_cancels_the_chains_current_run():
    start("waits.accumulator", 0, execution_id="acc3")
    send("acc3", "add", 1, message_id="a")
    drain()
    assert status("acc3") == "completed" and status("acc3~1") == "waiting"
    outcome = cancel("acc3", "stop the loop")
    assert (outcome.execution_id, outcome.status) == ("acc3~1", "cancelled")
    assert status("acc3~1") == "cancelled" and status("acc3") == "completed"


def test_get_event_of_a_run_that_continued_reads_the_chains_newest_run():
    start("waits.progress", {"n": 0, "until": 2}, execution_id="pg1")
    drain()
    assert status("pg1~2") == "waiting"
    assert get_event("pg1", "count") == 2  # not the first run's 0
    assert get_event("pg1", "first") == "set by the first run"  # carried along the chain
    assert get_event("pg1~1", "count", timeout=0.1) == 2


# -- R2: fork and children -------------------------------------------------------------------------
def test_a_fork_past_a_start_child_is_refused_and_writes_nothing():
    start("waits.spawner", None, execution_id="sp1")
    drain()
    assert status("sp1.child-1") == "waiting"
    before = Event.objects.count()
    with pytest.raises(InvalidInput, match="children"):
        fork("sp1", from_step=2, execution_id_new="sp1-fork")
    assert Event.objects.count() == before and not Execution.objects.filter(pk="sp1-fork").exists()


def test_a_fork_starts_its_own_child_and_cancelling_it_leaves_the_originals_alone():
    start("waits.spawner", None, execution_id="sp2")
    drain()
    assert fork("sp2", from_step=1, execution_id_new="sp2-fork") == "sp2-fork"
    drain()
    assert status("sp2-fork.child-1") == "waiting"  # its own child, id from its own id
    assert cancel("sp2-fork").status == "cancelled"
    assert status("sp2-fork.child-1") == "cancelled"
    assert status("sp2.child-1") == "waiting" and status("sp2") == "waiting"
    send("sp2.child-1", "release", None)
    drain()
    assert status("sp2") == "completed"


# -- R5: an operator's resume/suspend racing a waker's claim ---------------------------------------
@pytest.mark.parametrize("verb", ["resume", "suspend"])
def test_resume_or_suspend_without_force_refuses_a_run_a_waker_claimed_after_the_check(verb, monkeypatch):
    """The waker's claim is forced in between the liveness check and the header lock."""
    eid = f"race-{verb}"
    start("waits.sleeper", {"seconds": 3600}, execution_id=eid)
    assert wake_now(eid)  # its sleep is over: a claim now runs "after"
    claimed = []
    checked = runtime.check_not_live

    def check_then_claim(execution_id):
        checked(execution_id)
        from journal.store import store_for

        claimed.extend(store_for().claim_due_waits(timezone.now(), 5, ["waits.sleeper"]))

    monkeypatch.setattr(runtime, "check_not_live", check_then_claim)
    with pytest.raises(ExecutionBusy):
        resume(eid) if verb == "resume" else suspend(eid)
    assert [c.execution_id for c in claimed] == [eid]
    monkeypatch.setattr(runtime, "check_not_live", checked)
    # the woken run goes on under the claim's fence (nothing fenced it off) and runs "after" once
    assert resume(eid, token=claimed[0].token, force=True).status == "completed"
    assert [s for e, s in effect_rows() if e == eid] == ["before", "after"]


# -- R6: a stuck child; a cancelled parked retry ---------------------------------------------------
def test_a_stuck_child_ends_its_parents_wait_as_a_failure():
    start("waits.parent", {"n": 1, "wait": True}, execution_id="st1")
    drain()
    from journal.store import store_for

    assert Wait.objects.get(pk="st1").due_at > timezone.now()  # its recheck is a while away
    store_for().mark_stuck(["st1.child-0"])  # as the recovery sweep gives up on it
    drain()
    assert status("st1") == "failed" and "stuck" in Execution.objects.get(pk="st1").error


def test_cancelling_a_run_parked_on_a_retry_backoff_drops_its_wait_row():
    wf.FAIL_TIMES["rb1"] = 1
    assert start("waits.flaky", None, execution_id="rb1").status == "waiting"
    assert Wait.objects.filter(pk="rb1").exists()
    cancel("rb1")
    assert not Wait.objects.filter(pk="rb1").exists()
