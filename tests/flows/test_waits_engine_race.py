"""Flows that wait under real concurrency (committed transactions, one connection per thread):
two wakers racing for the same due waits wake each execution once and run each step once; the
worker's waker service (leases/waker.py) wakes a sleeping flow and a message's recipient. SQLite and
PostgreSQL."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connections

from journal.flows import events as ev
from journal.flows import ownership as own
from journal.flows import send, start, wake_due
from journal.models import Event, Execution, Fence
from leases.waker import WakeService
from leases.worker import Worker
from tests.conftest import effect_rows
from tests.fixtures import waits_flows  # noqa: F401  (registers the flows)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _flows(settings, effects):
    settings.LOOM_FLOW_MODULES = ["tests.fixtures.waits_flows"]
    settings.LOOM_SNAPSHOT_EVERY = None
    settings.LOOM_WAIT_INLINE_MAX = 0.0
    settings.LOOM_WAIT_POLL = 0.05
    settings.LOOM_WAIT_BATCH = 4
    installed = own.get_ownership()
    own.set_ownership(None)
    yield
    own.set_ownership(installed)


def statuses(prefix: str) -> dict[str, str]:
    return dict(Execution.objects.filter(pk__startswith=prefix).values_list("id", "status"))


def eventually(check, limit: float = 30.0, what: str = "") -> None:
    give_up = time.monotonic() + limit
    while time.monotonic() < give_up:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"not reached: {what}")


def test_two_wakers_racing_for_the_same_due_waits_wake_each_execution_once():
    ids = [f"race-{i:02d}" for i in range(12)]
    for eid in ids:
        assert start("waits.sleeper", {"seconds": 0.01}, execution_id=eid).status == "waiting"
    eventually(lambda: all(Event.objects.read(eid)[-1].type == ev.WAIT_STARTED for eid in ids), what="parked")
    time.sleep(0.05)  # every wait due (their due time is 10 ms after their park)
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def waker() -> None:
        try:
            barrier.wait()
            while wake_due(limit=2):
                pass
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=waker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert set(statuses("race-").values()) == {"completed"}
    afters = [eid for eid, step in effect_rows() if step == "after"]
    assert sorted(afters) == ids  # each execution's step after the sleep ran once
    assert {Fence.objects.current(eid) for eid in ids} == {2}  # one wake-up each: one fence advance


def test_the_worker_waker_wakes_a_sleeper_and_a_recipient():
    worker = Worker("waker-test", services=[WakeService])
    worker.start()
    try:
        start("waits.sleeper", {"seconds": 0.2}, execution_id="ws-1")
        start("waits.receiver", {"topic": "go"}, execution_id="ws-2")
        send("ws-2", "go", {"hello": 1})
        eventually(lambda: statuses("ws-") == {"ws-1": "completed", "ws-2": "completed"}, what="both woken")
    finally:
        worker.stop(5)
    assert Execution.objects.get(pk="ws-2").result == {"hello": 1}
    assert sorted(effect for effect in effect_rows() if effect[0].startswith("ws-")) == [
        ("ws-1", "after"), ("ws-1", "before"), ("ws-2", "after")]


def test_a_waiting_run_woken_before_its_lease_was_handed_back_is_run_at_once(settings):
    """With leases on, a parked run's lease row goes back in the background; a waker that claims the
    wait before that (a message already there: due now) runs it anyway: its claim moved the fence, so
    the parked run's lease row proves nothing, and the woken run's lease replaces it."""
    from leases.keeper import LeaseKeeper, reset_keeper
    from leases.models import Lease
    from leases.ownership import LeaseOwnership
    from leases.store import store_for as lease_store

    assert start("waits.two_messages", {}, execution_id="lw-1").status == "waiting"
    # The parked run's lease, not handed back yet (another worker's, live for a minute).
    assert lease_store().acquire_many("parker", [("lw-1", 1)], 60.0) == {"lw-1"}
    assert Lease.objects.filter(execution_id="lw-1", owner_id="parker").exists()
    keeper = LeaseKeeper("waker-node")
    own.set_ownership(LeaseOwnership("eager", keeper))
    try:
        send("lw-1", "t", "a")
        send("lw-1", "t", "b")
        outcomes = wake_due()
        assert [(o.execution_id, o.status) for o in outcomes] == [("lw-1", "completed")]
        assert Execution.objects.get(pk="lw-1").result == ["a", "b"]
    finally:
        keeper.shutdown(1)
        reset_keeper(None)


def test_a_caller_waiting_in_get_event_hears_the_flow_set_it():
    """get_event blocks in one thread (LISTEN on PostgreSQL, polls on SQLite) while another thread's
    waker runs the flow that sets the event."""
    from journal.flows import get_event

    start("waits.reply", {}, execution_id="ge-1")
    got: list = []

    def caller() -> None:
        try:
            got.append(get_event("ge-1", "reply", timeout=30, default="timed out"))
        finally:
            connections.close_all()

    thread = threading.Thread(target=caller)
    thread.start()
    send("ge-1", "next", 9)
    while not got and wake_due():
        pass
    thread.join(35)
    assert got == [{"got": 9}]


def test_suspend_and_resume_do_not_take_a_live_run_over():
    from leases.keeper import LeaseKeeper, reset_keeper
    from leases.ownership import LeaseOwnership

    keeper = LeaseKeeper("live-node")
    own.set_ownership(LeaseOwnership("eager", keeper))
    try:
        outcome = start("waits.self_suspend", {}, execution_id="live-1")
    finally:
        keeper.shutdown(1)
        reset_keeper(None)
    assert (outcome.status, outcome.result) == ("completed", ["busy", "busy"])
    assert Execution.objects.get(pk="live-1").status == "completed"


def test_the_waker_does_not_spin_on_a_due_wait_it_cannot_claim(settings):
    """A due wait of a flow this process has no code for: the waker claims nothing and sleeps a poll,
    not zero (a busy loop); with nothing due at all it also sleeps a poll."""
    from django.utils import timezone

    from journal.store import store_for
    from journal.store.base import WaitRecord

    settings.LOOM_WAIT_POLL = 0.7
    service = WakeService()
    service.pool = None
    assert service._pause(service.claim()) == 0.7  # nothing waits
    start("waits.sleeper", {"seconds": 3600}, execution_id="spin-0")
    assert 0 < service._pause(0) <= 0.7  # a timer later than now: until then, at most a poll
    assert store_for().park(WaitRecord("spin-0", "elsewhere.flow", "sleep", 1, 1, timezone.now()), "waiting")
    assert service.claim() == 0  # not a flow of this process
    assert service._pause(0) == 0.7


def test_a_wait_due_just_after_the_claim_is_claimed_at_once_not_a_poll_late(settings):
    """BUG 4: the claim found nothing, a wait of this process's flow became due a moment later: the
    waker claims again at once (it used to sleep a whole LOOM_WAIT_POLL: a poll late)."""
    from django.utils import timezone

    from journal.store import store_for
    from journal.store.base import WaitRecord

    settings.LOOM_WAIT_POLL = 0.7
    service = WakeService()
    service.pool = None
    start("waits.sleeper", {"seconds": 3600}, execution_id="late-0")
    assert service.claim() == 0
    due = timezone.now()  # due after the claim's `now`, before the pause's
    assert store_for().park(WaitRecord("late-0", "waits.sleeper", "sleep", 1, 1, due), "waiting")
    assert service._pause(0) == 0.0
    assert [c.execution_id for c in store_for().claim_due_waits(timezone.now(), 5, ["waits.sleeper"])] == ["late-0"]


def test_two_runs_racing_for_one_message_consume_it_once():
    """Two forced resumes of one waiting recipient at once (each takes a new fence): the message is
    consumed by one run only and recorded once in the log; the atomic step after it has one effect
    (a plain step fenced off mid-flight may run twice under force: docs/flows.md)."""
    from journal.flows import FlowError, resume
    from journal.models import Message

    start("waits.receiver_once", {}, execution_id="x-1")
    send("x-1", "go", "only once", message_id="one")
    barrier = threading.Barrier(2)
    results: list = []

    def run() -> None:
        try:
            barrier.wait()
            results.append(resume("x-1", force=True).status)
        except FlowError as exc:  # fenced off by the other run: OwnershipLost / NotResumable
            results.append(type(exc).__name__)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert "completed" in results and len(results) == 2
    recorded = [e for e in Event.objects.read("x-1") if e.type == ev.STEP_COMPLETED and e.payload["pos"] == 0]
    assert [e.payload["result"] for e in recorded] == ["only once"]
    message = Message.objects.get(execution_id="x-1")
    assert message.consumed_seq == recorded[0].seq
    assert [step for eid, step in effect_rows() if eid == "x-1"] == ["after"]


@pytest.mark.postgres
def test_the_due_claim_never_reads_due_waits_of_flows_it_does_not_claim():
    """R3: 50,000 due waits of a flow this worker lacks (another service's, or one removed from the
    code) next to 50,000 future ones of its own: the claim and the next-due probe are range scans of the
    (flow, due_at) index for its own flows (Index Cond on the flow), never a scan filtered by flow; and
    the claim takes none of the foreign rows."""
    from datetime import timedelta

    from django.utils import timezone

    from journal.models import Wait
    from journal.store import store_for

    now = timezone.now()
    rows = [(f"foreign-{i}", "elsewhere.flow", now - timedelta(minutes=1)) for i in range(50_000)]
    rows += [(f"own-{i}", "waits.sleeper", now + timedelta(days=1)) for i in range(5_000)]
    Execution.objects.bulk_create([Execution(id=eid, flow=flow, status="waiting") for eid, flow, _ in rows],
                                  batch_size=5_000)
    Wait.objects.bulk_create([Wait(execution_id=eid, flow=flow, kind="sleep", token=1, due_at=due)
                              for eid, flow, due in rows], batch_size=5_000)
    with connections["default"].cursor() as cursor:
        cursor.execute("ANALYZE journal_wait")  # the planner sees the real row counts
        cursor.execute("ANALYZE journal_execution")
    found = store_for().explain_due_waits(["waits.sleeper"])
    assert "journal_wait_flow_due" in found["plan"] and "Seq Scan on journal_wait" not in found["plan"]
    assert "journal_wait_flow_due" in found["next_due_plan"]
    assert store_for().claim_due_waits(timezone.now(), 16, ["waits.sleeper"]) == []
    assert store_for().next_wait_due(["waits.sleeper"]) == now + timedelta(days=1)
