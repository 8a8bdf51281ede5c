"""The write point of durable runs (journal/flows/writer.py) over the journal store's execution
statements: what one execution costs in statements, counted at the driver as the benchmarks count
them (benchmarks/harness.py counting_statements), on both backends, direct and coalesced."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections

from benchmarks.harness import counting_statements
from journal import coalesce
from journal.flows import ownership as own
from journal.flows import start
from journal.models import Event, Execution, Fence
from tests import flows_fixtures  # noqa: F401  (registers the flows)

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
