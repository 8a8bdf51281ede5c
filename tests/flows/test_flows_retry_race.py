"""Two retries of one failed execution: the loser changes nothing, the winner's run completes.

The retry reads the fence with the header and advances only from that fence, in the same
transaction as its event and the header update; a retry that read the header as failed before
another retry committed is refused by the advance (or rolled back with it), so the winner's
handed-over resume (expected_fence = its token) is not refused as "taken over since".
"""

from __future__ import annotations

import threading

import pytest
from django.db import connections

from journal.flows import NotResumable, runtime
from journal.flows.runtime import retry
from journal.models import Event, Execution, Fence
from tests.admin.test_admin_executions import _flows, failed, run_queued  # noqa: F401  (the autouse fixture)
from tests.fixtures import admin_flows as af

pytestmark = pytest.mark.django_db


def _snapshot(execution_id: str) -> tuple:
    return (Fence.objects.current(execution_id), [e.type for e in Event.objects.read(execution_id)],
            Execution.objects.get(pk=execution_id).status)


def test_a_retry_that_read_the_header_before_another_retry_committed_changes_nothing(monkeypatch):
    failed("race-1")
    stale = runtime.header_of("race-1")  # B reads the header: failed
    assert retry("race-1", handoff=True).status == "running"  # A commits and hands over at fence 2
    before = _snapshot("race-1")
    assert before[0] == 2 and before[2] == "running"
    monkeypatch.setattr(runtime, "header_of", lambda execution_id: stale)  # B decides on what it read
    with pytest.raises(NotResumable):
        retry("race-1", handoff=True)
    monkeypatch.undo()
    assert _snapshot("race-1") == before  # the refusal moved no fence and wrote nothing
    outcomes = run_queued()  # A's handed-over resume, as a worker runs it
    assert [o["status"] for o in outcomes] == ["completed"]
    assert Execution.objects.get(pk="race-1").status == "completed"


def test_a_retry_whose_fence_read_is_stale_is_refused_by_the_advance(monkeypatch):
    failed("race-2")
    stale = runtime._retry_view("race-2")  # B reads fence 1 and the header (failed) together
    assert stale[0] == 1
    assert retry("race-2", handoff=True).status == "running"
    before = _snapshot("race-2")
    monkeypatch.setattr(runtime, "_retry_view", lambda execution_id: stale)
    with pytest.raises(NotResumable, match="taken over since fence 1"):
        retry("race-2", handoff=True)
    monkeypatch.undo()
    assert _snapshot("race-2") == before
    assert [o["status"] for o in run_queued()] == ["completed"]


def test_a_retry_run_in_this_thread_still_completes_after_a_refused_one(monkeypatch):
    failed("race-3")
    stale = runtime.header_of("race-3")
    af.FAIL = False
    assert retry("race-3").status == "completed"  # A ran its attempt here, to the end
    before = _snapshot("race-3")
    monkeypatch.setattr(runtime, "header_of", lambda execution_id: stale)
    with pytest.raises(NotResumable):
        retry("race-3")
    monkeypatch.undo()
    assert _snapshot("race-3") == before


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_threads_racing_retry_one_wins_and_its_run_completes():
    """Real commits on PostgreSQL: each thread has its own connection, both start at a barrier."""
    for round_ in range(4):
        execution_id = f"race-t{round_}"
        failed(execution_id)
        barrier = threading.Barrier(2)
        results: list[object] = []

        def attempt(eid: str = execution_id, gate: threading.Barrier = barrier, results: list = results) -> None:
            try:
                gate.wait(10)
                results.append(retry(eid, handoff=True).status)
            except NotResumable as exc:
                results.append(exc)
            finally:
                connections.close_all()

        threads = [threading.Thread(target=attempt) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert sorted(map(type, results), key=str) == sorted([str, NotResumable], key=str), results
        fence, types, status = _snapshot(execution_id)
        assert (fence, types.count("EXECUTION_RETRIED"), status) == (2, 1, "running")
        assert [o["status"] for o in run_queued()] == ["completed"]
        assert Execution.objects.get(pk=execution_id).status == "completed"
