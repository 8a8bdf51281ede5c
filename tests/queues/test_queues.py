"""Queues on both backends, in one process: the dequeue's caps, order, not-before times, dedup ids,
re-offered claims, and bad input refused with our named errors and nothing written.

Workers as real processes (caps under 4 workers, one SIGKILLed; racing enqueues) are in
tests/queues/test_queues_processes.py.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from journal.flows import ExecutionExists, InvalidInput, UnknownFlow, flow, registry, retry_execution, start
from journal.flows.retry import RetryPolicy
from journal.models import Execution
from queues import InvalidEnqueue, InvalidQueue, QueueFull, UnknownQueue, cancel_pending, declare_queue, enqueue
from queues import stats as queue_stats
from queues.declarations import declared, forget
from queues.models import Queue, QueueEntry
from queues.service import run_claimed
from queues.store import store_for
from tests.fixtures import queue_flows  # noqa: F401  (registers the flows)

pytestmark = pytest.mark.django_db
LONG = 3600.0


@pytest.fixture(autouse=True, scope="module")
def stop_the_process_lease_keeper():
    """Runs here start the process's lease keeper thread; stop it at the end of the module, so that its
    connection does not outlive the test database."""
    yield
    from leases.keeper import get_keeper, reset_keeper

    get_keeper().shutdown()
    reset_keeper(None)


@pytest.fixture
def queue(request):
    """A fresh queue name for the test; its declaration is forgotten afterwards."""
    name = "t-" + request.node.name[:60].replace("[", "-").replace("]", "")
    yield name
    forget(name)


def flows() -> list[tuple[str, int]]:
    """What a worker's dispatcher passes: the (flow, version) pairs registered here."""
    return registry.runnable()


def claim(queue: str, limit: int = 100, owner: str = "tester", timeout: float = LONG):
    return store_for().dequeue(queue, owner, limit, flows(), timeout)


def inputs(claimed) -> list:
    return [c.input["n"] for c in claimed]


def running(queue: str) -> int:
    return next(s.running for s in queue_stats() if s.name == queue)


def test_start_with_a_queue_enqueues_and_runs_nothing_here(queue):
    """journal.flows.start(..., queue=...) is queues.enqueue: an entry with its options, status queued, and a
    second start with the same dedup id answers the live entry's execution; no step runs here (the execution
    exists at once, status queued: issue #24)."""
    declare_queue(queue, concurrency=2)
    first = start("queues.test.double", {"n": 1}, queue=queue, priority=5, dedup_id="d-1", partition_key="p")
    assert first.status == "queued" and not first.ok and Execution.objects.get(pk=first.execution_id).status == "queued"
    entry = QueueEntry.objects.get(execution_id=first.execution_id)
    assert (entry.state, entry.priority, entry.partition_key, entry.dedup_id) == ("pending", 5, "p", "d-1")
    again = start("queues.test.double", {"n": 2}, queue=queue, dedup_id="d-1")
    assert again.execution_id == first.execution_id and QueueEntry.objects.filter(queue__name=queue).count() == 1
    later = start("queues.test.double", {"n": 3}, queue=queue, delay=3600)
    assert QueueEntry.objects.get(execution_id=later.execution_id).run_after > datetime.now(UTC) + timedelta(minutes=30)
    assert [c.execution_id for c in claim(queue)] == [first.execution_id]  # the delayed one is not due


def test_queue_options_without_a_queue_and_a_timeout_on_a_queue_are_refused(queue):
    declare_queue(queue, concurrency=1)
    with pytest.raises(InvalidInput, match="give queue="):
        start("queues.test.double", {"n": 1}, dedup_id="x")
    assert not QueueEntry.objects.filter(queue__name=queue).exists() and not Execution.objects.exists()


def test_the_dequeue_takes_higher_priority_first_then_fifo(queue):
    declare_queue(queue, concurrency=10)
    for n, priority in [(0, 0), (1, 5), (2, 0), (3, 5), (4, -3)]:
        enqueue("queues.test.double", {"n": n}, queue=queue, priority=priority)
    assert inputs(claim(queue)) == [1, 3, 0, 2, 4]


def test_the_global_cap_bounds_what_runs_and_a_settled_run_frees_its_slot(queue):
    declare_queue(queue, concurrency=2)
    for n in range(5):
        enqueue("queues.test.double", {"n": n}, queue=queue)
    first = claim(queue)
    assert inputs(first) == [0, 1]
    assert claim(queue) == []  # both slots taken, though nothing has begun yet
    assert running(queue) == 2
    run_claimed(first[0])  # completes: its slot frees at the next dequeue
    assert inputs(claim(queue)) == [2]
    assert claim(queue) == []


def test_the_partition_cap_holds_per_key_and_other_keys_go_ahead(queue):
    declare_queue(queue, concurrency=10, partition_concurrency=1)
    for n, key in [(0, "a"), (1, "a"), (2, "b"), (3, None), (4, "a"), (5, "c")]:
        enqueue("queues.test.double", {"n": n}, queue=queue, partition_key=key)
    assert inputs(claim(queue)) == [0, 2, 3, 5]  # one per key; no key: only the global cap
    assert claim(queue) == []


def test_the_partition_cap_looks_past_a_page_of_full_partitions(queue, monkeypatch):
    monkeypatch.setattr(type(store_for()), "PAGE", 4)
    declare_queue(queue, concurrency=10, partition_concurrency=1)
    for n in range(9):
        enqueue("queues.test.double", {"n": n}, queue=queue, partition_key="busy" if n < 8 else "free")
    assert inputs(claim(queue)) == [0, 8]


def test_the_rate_limit_counts_starts_in_its_window(queue):
    declare_queue(queue, concurrency=10, rate_limit=3, rate_period=LONG)
    for n in range(5):
        enqueue("queues.test.double", {"n": n}, queue=queue)
    first = claim(queue, limit=2)
    assert inputs(first) == [0, 1]
    for entry in first:
        run_claimed(entry)
    assert inputs(claim(queue)) == [2]  # 2 started in the window (and finished): one start left
    assert claim(queue) == []


def test_run_after_in_the_future_is_not_claimed_and_a_past_one_is(queue):
    declare_queue(queue, concurrency=10)
    later = datetime.now(UTC) + timedelta(hours=1)
    enqueue("queues.test.double", {"n": 0}, queue=queue, run_after=later)
    enqueue("queues.test.double", {"n": 1}, queue=queue, run_after=datetime.now(UTC) - timedelta(seconds=1))
    assert inputs(claim(queue)) == [1]
    stats = next(s for s in queue_stats() if s.name == queue)
    assert (stats.pending, stats.ready, stats.running) == (1, 0, 1)


def test_a_dedup_id_returns_the_live_execution_until_it_settles(queue):
    declare_queue(queue, concurrency=10)
    first = enqueue("queues.test.double", {"n": 1}, queue=queue, dedup_id="d")
    again = enqueue("queues.test.double", {"n": 2}, queue=queue, dedup_id="d")
    assert first.created and not again.created and again.execution_id == first.execution_id
    (entry,) = claim(queue)
    assert enqueue("queues.test.double", {"n": 3}, queue=queue, dedup_id="d").execution_id == first.execution_id
    run_claimed(entry)  # settled: the id is free again
    fresh = enqueue("queues.test.double", {"n": 4}, queue=queue, dedup_id="d")
    assert fresh.created and fresh.execution_id != first.execution_id
    assert QueueEntry.objects.filter(queue_id=queue).count() == 2


def test_an_execution_id_is_idempotent_for_the_same_start_and_refused_for_another(queue):
    declare_queue(queue, concurrency=10)
    assert enqueue("queues.test.double", {"n": 1}, queue=queue, execution_id=f"{queue}-x").created
    assert not enqueue("queues.test.double", {"n": 1}, queue=queue, execution_id=f"{queue}-x").created
    with pytest.raises(ExecutionExists):
        enqueue("queues.test.double", {"n": 2}, queue=queue, execution_id=f"{queue}-x")
    start("queues.test.double", {"n": 1}, execution_id=f"{queue}-y")
    with pytest.raises(ExecutionExists):  # already an execution
        enqueue("queues.test.double", {"n": 1}, queue=queue, execution_id=f"{queue}-y")
    assert QueueEntry.objects.filter(queue_id=queue).count() == 1


def test_an_entry_can_be_cancelled_until_its_run_begins(queue):
    """Review R4: pending, or claimed by a worker that has not begun it: cancelled, and the worker's
    runner refuses to start it; once begun, cancel_pending says no (journal.flows.cancel then)."""
    declare_queue(queue, concurrency=2)
    a = enqueue("queues.test.double", {"n": 0}, queue=queue)
    b = enqueue("queues.test.double", {"n": 1}, queue=queue)
    c = enqueue("queues.test.double", {"n": 2}, queue=queue)
    claimed_a, claimed_b = claim(queue)
    assert cancel_pending(a.execution_id)  # claimed, not begun
    assert cancel_pending(c.execution_id)  # pending
    assert run_claimed(claimed_a) == "cancelled"
    assert Execution.objects.get(pk=a.execution_id).status == "cancelled"  # issue #24: it existed, queued
    assert run_claimed(claimed_b) == "completed"
    assert not cancel_pending(b.execution_id) and not cancel_pending("no-such-entry")
    assert claim(queue) == []  # the cancelled ones are never started
    assert Execution.objects.get(pk=c.execution_id).status == "cancelled"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)  # two threads, two connections
def test_a_cancel_racing_the_runner_either_cancels_or_lets_it_run(queue):
    """Review R4, racing: the cancel and the runner's begin meet on the entry row: exactly one wins."""
    import threading

    from django.db import connections

    declare_queue(queue, concurrency=50)
    ids = [enqueue("queues.test.double", {"n": n}, queue=queue).execution_id for n in range(12)]
    claimed = {c.execution_id: c for c in claim(queue)}
    results: dict[str, tuple] = {}

    def race(eid: str) -> None:
        barrier = threading.Barrier(2)
        out: dict[str, object] = {}

        def run() -> None:
            barrier.wait()
            out["run"] = run_claimed(claimed[eid])
            connections.close_all()

        def cancel() -> None:
            barrier.wait()
            out["cancel"] = cancel_pending(eid)
            connections.close_all()

        threads = [threading.Thread(target=run), threading.Thread(target=cancel)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        results[eid] = (out["cancel"], out["run"])

    for eid in ids:
        race(eid)
    for eid, (cancelled, run) in results.items():
        exists = Execution.objects.filter(pk=eid).exists()
        state = QueueEntry.objects.get(execution_id=eid).state
        if cancelled:
            status = Execution.objects.get(pk=eid).status  # issue #24: the queued execution exists, cancelled
            assert (run, exists, status, state) == ("cancelled", True, "cancelled", "cancelled"), eid
        else:
            assert run == "completed" and exists and state == "started", eid


@pytest.mark.django_db(transaction=True)  # the database clock moves only between transactions (PostgreSQL)
def test_a_claim_whose_execution_never_began_is_offered_again(queue):
    """A worker that died between its claim and the execution's first write: the entry holds its
    slot until the claim timeout, then it is claimed again and runs once."""
    declare_queue(queue, concurrency=1)
    enqueue("queues.test.double", {"n": 7}, queue=queue)
    (lost,) = claim(queue, owner="dead", timeout=0.05)
    assert claim(queue, timeout=LONG) == []  # still counted: the claim is fresh
    time.sleep(0.1)
    (again,) = claim(queue, owner="alive", timeout=0.05)
    assert again.execution_id == lost.execution_id and again.attempts == 2
    assert run_claimed(again) == "completed"
    assert run_claimed(lost) == "cancelled"  # the dead worker's late start is refused: not its claim now
    assert QueueEntry.objects.get(execution_id=lost.execution_id).worker == "alive"


def test_a_running_execution_keeps_its_slot_until_it_settles(queue):
    """The slot is the execution's, not the claimer's: the header decides when it is free."""
    declare_queue(queue, concurrency=1)
    enqueue("queues.test.double", {"n": 1}, queue=queue, execution_id=f"{queue}-run")
    enqueue("queues.test.double", {"n": 2}, queue=queue)
    (entry,) = claim(queue)
    Execution.objects.filter(pk=entry.execution_id).update(status="running")  # begun, then its worker died
    assert claim(queue, timeout=0.0) == []  # not re-offered (it began) and still counted
    Execution.objects.filter(pk=entry.execution_id).update(status="completed")  # e.g. recovered and finished
    assert inputs(claim(queue)) == [2]


def test_a_stuck_execution_keeps_its_slot(queue):
    """Review R2: a resume of a stuck execution runs it under the header status "stuck" until it settles,
    so stuck is not settled in the queue's eyes: the resume stays inside the cap."""
    declare_queue(queue, concurrency=1)
    enqueue("queues.test.double", {"n": 1}, queue=queue)
    enqueue("queues.test.double", {"n": 2}, queue=queue)
    (entry,) = claim(queue)
    Execution.objects.filter(pk=entry.execution_id).update(status="stuck")
    assert claim(queue) == [] and running(queue) == 1
    Execution.objects.filter(pk=entry.execution_id).update(status="cancelled")
    assert inputs(claim(queue)) == [2]


PROBES: dict[str, list | None] = {}


def _fail_then_probe(value):
    """First run: fail. Run again (a retry): from inside the running execution, try to claim."""
    if value["queue"] not in PROBES:
        PROBES[value["queue"]] = None
        raise RuntimeError("the first run fails")
    PROBES[value["queue"]] = [c.execution_id for c in claim(value["queue"]) or []]
    return 1


@flow("queues.test.retried", retry=RetryPolicy(attempts=1))
def retried(ctx, value):
    return ctx.step("probe", _fail_then_probe, value)


def test_a_retried_execution_counts_against_the_cap_again(queue):
    """Review R2: a failed execution's entry is done (its slot free); a retry runs it again, so it takes
    its slot back: the pending entry is not claimed while it runs, and is once it has settled."""
    declare_queue(queue, concurrency=1)
    a = enqueue("queues.test.retried", {"queue": queue}, queue=queue)
    (first,) = claim(queue)
    assert run_claimed(first) == "failed"
    assert claim(queue) == []  # the dequeue settles a: done
    assert QueueEntry.objects.get(execution_id=a.execution_id).state == "done"
    b = enqueue("queues.test.double", {"n": 1}, queue=queue)
    assert retry_execution(a.execution_id).status == "completed"
    assert PROBES[queue] == []  # while a ran again, b was not claimed
    assert [c.execution_id for c in claim(queue)] == [b.execution_id]


def test_a_retry_is_refused_while_the_queue_is_full(queue):
    """A retry that would run over the cap is refused (nothing written); once a slot is free it runs."""
    declare_queue(queue, concurrency=1)
    a = enqueue("queues.test.retried", {"queue": queue}, queue=queue)
    (first,) = claim(queue)
    assert run_claimed(first) == "failed"
    enqueue("queues.test.double", {"n": 1}, queue=queue)
    (b,) = claim(queue)  # settles a, claims b: the queue is full
    with pytest.raises(QueueFull):
        retry_execution(a.execution_id)
    assert Execution.objects.get(pk=a.execution_id).status == "failed"
    assert run_claimed(b) == "completed"
    assert retry_execution(a.execution_id).status == "completed"


def test_declarations_write_the_caps_to_the_queue_row(queue):
    declare_queue(queue, concurrency=3, partition_concurrency=2, rate_limit=5, rate_period=10)
    enqueue("queues.test.double", {"n": 1}, queue=queue)
    row = Queue.objects.get(pk=queue)
    assert (row.concurrency, row.partition_concurrency, row.rate_limit, row.rate_period) == (3, 2, 5, 10.0)


def test_loom_queues_setting_declares_queues(settings):
    settings.LOOM_QUEUES = {"t-settings": {"concurrency": 4, "partition_concurrency": 1}}
    assert enqueue("queues.test.double", {"n": 1}, queue="t-settings").created
    assert Queue.objects.get(pk="t-settings").concurrency == 4


# -- bad input: our named error, nothing written ---------------------------------------------------------

def _written() -> tuple[int, int]:
    return Queue.objects.count(), QueueEntry.objects.count()


@pytest.mark.parametrize("options", [
    {"concurrency": 0}, {"concurrency": -1}, {"concurrency": 1.5}, {"concurrency": True}, {"concurrency": "8"},
    {"concurrency": 1, "partition_concurrency": 0}, {"concurrency": 1, "rate_limit": 0, "rate_period": 1},
    {"concurrency": 1, "rate_limit": 5}, {"concurrency": 1, "rate_limit": 5, "rate_period": float("nan")},
    {"concurrency": 1, "rate_limit": 5, "rate_period": 0},
])
def test_a_cap_below_one_or_a_bad_rate_is_invalid_queue(options):
    before = _written()
    with pytest.raises(InvalidQueue):
        declare_queue("t-bad", **options)
    assert _written() == before


def test_a_bad_loom_queues_setting_is_reported_by_the_system_check(settings):
    from journal.conf import problems

    settings.LOOM_QUEUES = {"t-bad": {"concurrency": 0}}
    assert any("LOOM_QUEUES" in p for p in problems())
    settings.LOOM_QUEUES = {"t-bad": {"concurency": 2}}
    assert any("unknown option" in p for p in problems())


settings_profile = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

junk = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=5),
                 st.lists(st.integers(), max_size=2))


@settings_profile
@given(name=st.one_of(st.text(max_size=120), junk))
def test_an_unknown_queue_is_refused_and_nothing_is_written(name):
    assume(not isinstance(name, str) or name not in declared())
    before = _written()
    with pytest.raises(UnknownQueue):
        enqueue("queues.test.double", {"n": 1}, queue=name)
    assert _written() == before


@settings_profile
@given(priority=junk, partition=junk, dedup=junk, run_after=st.one_of(junk, st.datetimes()))
def test_bad_enqueue_options_are_invalid_enqueue_and_nothing_is_written(queue, priority, partition, dedup, run_after):
    declare_queue(queue, concurrency=1)
    good_priority = isinstance(priority, int) and not isinstance(priority, bool) and -100 <= priority <= 100
    good_key = lambda v: v is None or (isinstance(v, str) and v != "" and v.isprintable() and " " not in v  # noqa: E731
                                       and "." not in v and len(v) <= 200)
    good_time = run_after is None or (isinstance(run_after, datetime) and run_after.tzinfo is not None)
    if good_priority and good_key(partition) and good_key(dedup) and good_time:
        return  # a valid combination: other tests cover what it does
    before = _written()
    with pytest.raises(InvalidEnqueue):
        enqueue("queues.test.double", {"n": 1}, queue=queue, priority=priority, partition_key=partition,
                dedup_id=dedup, run_after=run_after)
    assert _written() == before


@settings_profile
@given(value=st.one_of(st.sets(st.integers(), min_size=1), st.just(float("nan")), st.just({1: "a"}),
                       st.just({"a": object()}), st.just("\x00"), st.just(b"bytes")))
def test_input_that_is_not_json_is_invalid_input_and_nothing_is_written(queue, value):
    declare_queue(queue, concurrency=1)
    before = _written()
    with pytest.raises(InvalidInput):
        enqueue("queues.test.double", {"n": value}, queue=queue)
    assert _written() == before


def test_an_unknown_flow_is_refused_and_nothing_is_written(queue):
    declare_queue(queue, concurrency=1)
    before = _written()
    with pytest.raises(UnknownFlow):
        enqueue("no.such.flow", {}, queue=queue)
    assert _written() == before


DEFERRED = 20_000


def _plan_nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", []):
        yield from _plan_nodes(child)


@pytest.mark.postgres
def test_deferred_entries_are_not_read_by_the_poll_statements(queue):
    """Review R1: entries deferred to a later time stay out of the readiness probe and the candidates:
    their plans read an index range of due entries, never a row per deferred entry."""
    from django.db import connection

    from journal.store.base import flow_keys
    from queues.store import postgres as statements

    names, versions = flow_keys(flows())  # as the store binds a worker's (flow, version) pairs
    keys = {"flows": names, "versions": versions}
    declare_queue(queue, concurrency=8)
    enqueue("queues.test.double", {"n": 0}, queue=queue)  # one due entry
    later = datetime.now(UTC) + timedelta(days=1)
    QueueEntry.objects.bulk_create(
        QueueEntry(queue_id=queue, execution_id=f"{queue}-later-{n}", flow="queues.test.double", input='{"n": 1}',
                   run_after=later, enqueued_at=later) for n in range(DEFERRED))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE queues_entry")
        for name, sql, params in [
            ("READY_QUEUES", statements.READY_QUEUES, {**keys, "timeout": LONG}),
            ("NEXT_DUE", statements.NEXT_DUE, keys),  # a listening dispatcher's idle probe
            ("CANDIDATES", statements.CANDIDATES, {"queue": queue, **keys, "after_priority": 101,
                                                   "after_id": 0, "page": 8}),
        ]:
            cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
            plan = cursor.fetchone()[0]
            plan = (plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]
            nodes = list(_plan_nodes(plan))
            entry_scans = [n for n in nodes if n.get("Relation Name") == "queues_entry"]
            assert entry_scans and all(n["Node Type"] != "Seq Scan" for n in entry_scans), (name, nodes)
            read = max(n.get("Actual Rows", 0) + n.get("Rows Removed by Filter", 0) for n in entry_scans)
            assert read < 100, (name, read, nodes)  # the due one, not 20,000 deferred ones
    assert claim(queue) and next(s for s in queue_stats() if s.name == queue).pending == DEFERRED


bad_ids = st.one_of(st.text(max_size=20).map(lambda s: s + "\ud800"), st.text(max_size=20).map(lambda s: "\x00" + s),
                    st.just(""), st.text(min_size=201, max_size=220), st.integers(), st.none())


@settings_profile
@given(execution_id=bad_ids)
def test_cancel_pending_and_entry_of_an_id_no_entry_can_have_say_so_cleanly(queue, execution_id):
    """Review R5: an id the database cannot hold (lone surrogate, NUL, empty, too long, not a string)
    names no entry: cancel_pending is False and entry_of None, no driver error, nothing written."""
    from queues import entry_of

    declare_queue(queue, concurrency=1)
    enqueue("queues.test.double", {"n": 1}, queue=queue)
    assert cancel_pending(execution_id) is False
    assert entry_of(execution_id) is None
    assert set(QueueEntry.objects.filter(queue_id=queue).values_list("state", flat=True)) == {"pending"}
