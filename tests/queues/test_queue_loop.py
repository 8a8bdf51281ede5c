"""The loop lane of the queue dispatcher (queues/loop.py), in process: LOOM_QUEUE_ASYNC_RUNS is checked like every
setting (loom.E001); a flow registered sync never goes to the loop lane; a claimed entry of an async flow run from
the loop (`arun_claimed`) gives the statuses, writes the events and has the spans that `run_claimed` gives, writes
and has on a thread.
The worker processes: tests/flows/test_flows_async_worker_loop.py. SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import collections

import pytest
from django.test import override_settings
from hypothesis import given
from hypothesis import strategies as st

from journal.checks import check_settings
from journal.flows import registry
from journal.models import Event
from queues import cancel_pending, enqueue
from queues.service import Lane, arun_claimed, run_claimed
from queues.store import store_for
from tests.fixtures import edge_waits_flows as wf
from tests.fixtures import queue_flows  # noqa: F401  (registers queues.test.*: sync flows)
from tests.flows import async_sleep_flows  # noqa: F401  (registers asleep.edge: an async flow)
from tests.journal.test_telemetry import spans  # noqa: F401  (the fixture: tracing into memory)


@given(st.integers(min_value=-10**6, max_value=10**6))
def test_loom_queue_async_runs_accepts_every_count_from_zero_and_the_check_refuses_a_negative_one(value):
    with override_settings(LOOM_QUEUE_ASYNC_RUNS=value):
        refused = [m for m in check_settings() if m.id == "loom.E001" and "LOOM_QUEUE_ASYNC_RUNS" in m.msg]
    assert bool(refused) == (value < 0)


@given(st.text(alphabet="abcxyz .,_", min_size=1, max_size=8).filter(str.strip))
def test_loom_queue_async_runs_that_is_not_a_count_is_refused_by_the_check(value):
    with override_settings(LOOM_QUEUE_ASYNC_RUNS=value):
        assert any("LOOM_QUEUE_ASYNC_RUNS" in m.msg for m in check_settings() if m.id == "loom.E001")


def test_a_flow_registered_sync_stays_on_the_thread_lane_and_an_async_one_goes_to_the_loop():
    runnable = registry.runnable()
    threads, looped = Lane("threads", 1, False, print).flows(runnable), Lane("loop", 1, True, print).flows(runnable)
    assert ("queues.test.double", 1) in threads and ("queues.test.double", 1) not in looped
    assert ("asleep.edge", 1) in looped and ("asleep.edge", 1) not in threads
    assert sorted(threads + looped) == runnable  # every flow version has exactly one lane
    assert Lane("threads", 1, None, print).flows(runnable) == runnable  # no loop lane: the threads run them all


@pytest.fixture
def keeper_stopped_after():
    yield
    from leases.keeper import get_keeper, reset_keeper

    get_keeper().shutdown()
    reset_keeper(None)


def claim(queue: str) -> list:
    return store_for().dequeue(queue, "test-worker", 10, registry.runnable(), 3600.0) or []


@pytest.mark.django_db(transaction=True)  # the loop-driven run's journal calls use the pool threads' sessions
def test_an_async_entry_run_from_the_loop_gives_the_status_and_events_of_one_run_on_a_thread(
        settings, keeper_stopped_after):
    settings.LOOM_QUEUES = {"lq": {"concurrency": 10}}
    wf.create_effects_table()
    for eid in ("lq-thread", "lq-loop", "lq-gone"):
        enqueue("asleep.edge", {"seconds": 0.05}, queue="lq", execution_id=eid)
    entries = {entry.execution_id: entry for entry in claim("lq")}
    assert sorted(entries) == ["lq-gone", "lq-loop", "lq-thread"]
    assert cancel_pending("lq-gone")  # cancelled after its claim, before its begin: its claim no longer holds
    assert run_claimed(entries["lq-thread"]) == "completed"
    assert asyncio.run(arun_claimed(entries["lq-loop"])) == "completed"
    assert asyncio.run(arun_claimed(entries["lq-gone"])) == run_claimed(entries["lq-gone"]) == "cancelled"
    assert [e.type for e in Event.objects.read("lq-loop")] == [e.type for e in Event.objects.read("lq-thread")]
    assert len(Event.objects.read("lq-loop")) == 2 * 3 + 2
    assert collections.Counter(wf.effects("lq-")) == {(eid, step): 1 for eid in ("lq-loop", "lq-thread")
                                                      for step in ("before", "after")}  # nothing of lq-gone ran


@pytest.mark.django_db(transaction=True)
def test_an_async_entry_run_from_the_loop_has_the_spans_of_one_run_on_a_thread(
        settings, spans, keeper_stopped_after):  # noqa: F811
    """The dispatch span, the run's span inside it, and the steps' and the sleep's spans inside that: the same tree
    for a run driven from the loop as for one driven on a runner thread."""
    settings.LOOM_QUEUES = {"lq": {"concurrency": 10}}
    wf.create_effects_table()
    for eid in ("lqt-thread", "lqt-loop"):
        enqueue("asleep.edge", {"seconds": 0.05}, queue="lq", execution_id=eid)
    entries = {entry.execution_id: entry for entry in claim("lq")}
    assert run_claimed(entries["lqt-thread"]) == "completed"
    assert asyncio.run(arun_claimed(entries["lqt-loop"])) == "completed"
    finished = spans.get_finished_spans()

    def tree(eid: str) -> tuple:
        mine = [one for one in finished if one.attributes.get("loom.execution_id") == eid]
        (dispatch,) = [one for one in mine if one.name == "loom.queue.dispatch"]
        (run,) = [one for one in mine if one.name == "loom.run asleep.edge"]
        assert run.parent.span_id == dispatch.context.span_id
        inside = sorted((one.name, one.attributes["loom.pos"]) for one in mine
                        if one.parent is not None and one.parent.span_id == run.context.span_id)
        return run.attributes["loom.status"], run.context.trace_id == dispatch.context.trace_id, inside

    assert tree("lqt-loop") == tree("lqt-thread") == (
        "completed", True, [("loom.step after", 2), ("loom.step before", 0), ("loom.wait sleep", 1)])
