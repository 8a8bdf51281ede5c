"""The write point of durable runs (journal/flows/writer.py) over the journal store's execution
statements: what one execution costs in statements, counted at the driver as the benchmarks count
them (benchmarks/harness.py counting_statements), on both backends, direct and coalesced."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections

from benchmarks.harness import counting_statements
from journal import coalesce
from journal.envelopes import AppendItem, Envelope
from journal.exceptions import BatchRefused, StaleFence, StreamExists
from journal.flows import ownership as own
from journal.flows import start
from journal.models import Event, Execution, Fence
from journal.store import store_for
from journal.store.base import ExecutionBoot, ExecutionSettle
from tests.fixtures import flows_fixtures  # noqa: F401  (registers the flows)

pytestmark = pytest.mark.django_db(transaction=True)

# The statements (and, among them, transaction control) of one fresh 1-step run that succeeds:
# PostgreSQL: the bootstrap statement and the settle statement, in autocommit, nothing else.
# SQLite: the bootstrap's IMMEDIATE transaction (BEGIN, fence, events, header, COMMIT) and the
# settle's (BEGIN, the guarded append's savepoint, fence and tip reads, events, RELEASE, header,
# COMMIT): plain statements under the write lock, no round trip to save. (Before the store owned
# these statements, issue 14, the bootstrap also took a savepoint: 15 statements, 8 of control.)
ONE_STEP = {"postgresql": (2, 0), "sqlite": (13, 6)}


@pytest.fixture(autouse=True)
def _no_ownership():
    """The write path alone (leases have their own suite, inline leases included)."""
    installed = own.get_ownership()
    own.set_ownership(None)
    coalesce.close_shared()
    yield
    coalesce.close_shared()
    own.set_ownership(installed)


def counted_run(execution_id: str) -> tuple[int, int]:
    """(statements, control) of one start in a thread of its own, on connections opened for it (its
    own and, when coalescing, the flush threads'): the caller's verification reads stay out."""
    connection.ensure_connection()
    outcome: list = []

    def run() -> None:
        try:
            outcome.append(start("test.chain", {"n": 1}, execution_id=execution_id))
        finally:
            connections.close_all()

    start("test.chain", {"n": 1}, execution_id=f"{execution_id}-warm")  # first use: imports
    coalesce.close_shared()  # the coalescer's flush threads open their connections inside the count
    with counting_statements() as counter:
        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
        counted = counter.snapshot()
    assert outcome and outcome[0].status == "completed"
    return counted


def test_a_one_step_run_costs_a_fixed_number_of_statements():
    """Direct (LOOM_COALESCE off): PostgreSQL 2 statements, SQLite its two short transactions; the
    header and the log are written by them, nothing is read."""
    assert counted_run("cost-1") == ONE_STEP[connection.vendor]
    assert Execution.objects.get(pk="cost-1").status == "completed"
    assert [e.seq for e in Event.objects.read("cost-1")] == [0, 1, 2, 3]
    assert Fence.objects.current("cost-1") == 1


def test_a_lone_coalesced_run_costs_no_more_than_a_direct_one(settings):
    """Through the coalescer (LOOM_COALESCE on) a run alone still costs what it costs direct: on
    PostgreSQL its bootstrap and settle are the flows kinds' statements on a flush thread; on SQLite
    they stay direct (nothing to merge under one writer)."""
    settings.LOOM_COALESCE = True
    assert counted_run("cost-co") == ONE_STEP[connection.vendor]
    assert Execution.objects.get(pk="cost-co").status == "completed"


# -- the journal store's execution methods, on each backend (what writer.py relies on) --------------

def boot(execution_id: str, status: str = "running") -> ExecutionBoot:
    item = AppendItem.build(execution_id, [Envelope("EXECUTION_STARTED", {"flow": "test.chain", "input": {}}),
                                           Envelope("STEP_STARTED", {"step": "s0", "pos": 0})])
    return ExecutionBoot(item, store_for().encode([item])[0], "test.chain", status, "{}", None, "", False)


def settle(execution_id: str, token: int, tip: int) -> ExecutionSettle:
    item = AppendItem.build(execution_id, [Envelope("EXECUTION_COMPLETED", {"result": 7})], token, tip)
    return ExecutionSettle(item, store_for().encode([item])[0], "completed", "7", "")


def seqs(execution_id: str) -> list[int]:
    return [e.seq for e in Event.objects.read(execution_id)]


def test_a_second_bootstrap_of_an_id_is_refused_and_writes_nothing():
    """StreamExists for an id that has a fence, or events without one (an aggregate's stream); the
    header, fence and events stay as they were."""
    store = store_for()
    assert store.bootstrap_execution(boot("sb-1")) == 1
    with pytest.raises(StreamExists):
        store.bootstrap_execution(boot("sb-1", status="completed"))
    assert (seqs("sb-1"), Fence.objects.current("sb-1")) == ([0, 1], 1)
    assert store.execution_status("sb-1") == ("running", "test.chain", None, "")
    Event.objects.append("agg-1", Envelope("Created"))
    with pytest.raises(StreamExists):
        store.bootstrap_execution(boot("agg-1"))
    assert (seqs("agg-1"), Fence.objects.current("agg-1"), store.execution_status("agg-1")) == ([0], None, None)


def test_bootstrap_many_starts_the_new_ids_and_refuses_the_existing_one():
    """Per execution: token 1, or StreamExists for the id that exists (nothing written for it)."""
    store = store_for()
    store.bootstrap_execution(boot("bm-1"))
    outcomes = store.bootstrap_many([boot("bm-0"), boot("bm-1"), boot("bm-2")])
    assert outcomes[0] == 1 and outcomes[2] == 1 and isinstance(outcomes[1], StreamExists)
    assert [seqs(f"bm-{n}") for n in range(3)] == [[0, 1]] * 3
    assert set(Execution.objects.filter(id__startswith="bm-").values_list("id", flat=True)) == {"bm-0", "bm-1", "bm-2"}


def test_a_settle_refused_by_the_fence_leaves_the_new_owners_header_alone():
    """A stale token: StaleFence, no event, and the header stays as the new owner keeps it."""
    store = store_for()
    store.bootstrap_execution(boot("ss-1"))
    Fence.objects.advance("ss-1")  # a resume or cancel took it over
    with pytest.raises(StaleFence):
        store.settle_execution(settle("ss-1", token=1, tip=1))
    assert seqs("ss-1") == [0, 1] and store.execution_status("ss-1")[0] == "running"
    assert store.settle_execution(settle("ss-1", token=2, tip=1)).last_seq == 2
    assert store.execution_status("ss-1") == ("completed", "test.chain", 7, "")
    assert Execution.objects.get(pk="ss-1").finished_at is not None


def test_settle_many_is_all_or_nothing_and_names_the_refused():
    """One stale settle in a batch: BatchRefused naming it, no event and no header written for any;
    the others settle once written again without it."""
    store = store_for()
    for n in range(3):
        store.bootstrap_execution(boot(f"sm-{n}"))
    Fence.objects.advance("sm-1")
    with pytest.raises(BatchRefused) as refused:
        store.settle_many([settle(f"sm-{n}", token=1, tip=1) for n in range(3)])
    assert set(refused.value.errors) == {"sm-1"} and isinstance(refused.value.errors["sm-1"], StaleFence)
    assert [seqs(f"sm-{n}") for n in range(3)] == [[0, 1]] * 3
    assert {store.execution_status(f"sm-{n}")[0] for n in range(3)} == {"running"}
    assert [a.last_seq for a in store.settle_many([settle("sm-0", 1, 1), settle("sm-2", 1, 1)])] == [2, 2]
    assert [store.execution_status(f"sm-{n}")[0] for n in range(3)] == ["completed", "running", "completed"]
