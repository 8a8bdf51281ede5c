"""The path of an execution id from start() to its journal writes (docs/architecture.md, "The path of an
execution id"): the execution's shard is asked for once, where the start begins, and everything below (the
unseal, the scheduled write, the run's writes, its lease, a halted run's header read) works on the binding;
every write of a run goes through the writer, one call a boundary (a wait row, a settle's carry and wake-up)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings

from journal import coalesce, shards
from journal.flows import ExecutionExists, cancel, ownership, send, start, wake_due, writer
from journal.flows import events as ev
from journal.flows.context import now
from journal.models import Execution
from tests.fixtures import (
    flows_fixtures,  # noqa: F401  (registers the flows)
    waits_flows,  # noqa: F401  (registers the flows that wait)
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def placements(monkeypatch) -> list[str]:
    """Every stream id `shards.shard_for` is asked to place, in order."""
    asked: list[str] = []
    place = shards.shard_for

    def counted(stream_id: str) -> str:
        asked.append(stream_id)
        return place(stream_id)

    monkeypatch.setattr(shards, "shard_for", counted)
    return asked


@pytest.fixture
def writes(monkeypatch, settings, effects) -> list[tuple]:
    """Every call of the writer, in order: (id, event types, the settle's status, parent, onward) for `write`,
    (id, "park", the wait's kind) for `park`. Waits park (LOOM_WAIT_INLINE_MAX=0)."""
    settings.LOOM_WAIT_INLINE_MAX = 0.0
    installed = ownership.get_ownership()
    ownership.set_ownership(None)  # no lease keeper: the runs that park here leave no lease to keep
    calls: list[tuple] = []
    write, park = writer.write, writer.park

    def written(run, envelopes, settle=None):
        calls.append((run.execution_id, [e.type for e in envelopes], *(
            (settle.status, settle.parent, settle.onward) if settle is not None else (None, None, None))))
        return write(run, envelopes, settle)

    def parked(run, spec):
        calls.append((run.execution_id, "park", spec.kind))
        return park(run, spec)

    monkeypatch.setattr(writer, "write", written)
    monkeypatch.setattr(writer, "park", parked)
    yield calls
    ownership.set_ownership(installed)


def drain(rounds: int = 30) -> None:
    """Run the waker here until nothing is due (a bound on rounds, not a timing claim)."""
    for _ in range(rounds):
        if not wake_due():
            return


@pytest.fixture(params=[True, False], ids=["coalesced", "direct"])
def coalescing(request):
    with override_settings(LOOM_COALESCE=request.param):
        coalesce.close_shared()
        yield request.param
    coalesce.close_shared()


def test_a_run_places_its_execution_once_for_all_of_its_writes(placements, coalescing):
    """A start that runs three steps (a bootstrap, appends, a settle) asks for its shard once."""
    outcome = start("test.chain", {"n": 3}, execution_id="path-run")
    assert outcome.status == "completed"
    assert placements.count("path-run") == 1


def test_a_start_without_an_id_places_the_minted_id_once(placements, coalescing):
    outcome = start("test.chain", {"n": 2})
    assert outcome.status == "completed"
    assert placements.count(outcome.execution_id) == 1
    assert Execution.objects.filter(pk=outcome.execution_id, status="completed").exists()


def test_a_scheduled_start_places_its_execution_once(placements, coalescing):
    """The scheduled write and its park are on the shard the start bound (waits.schedule_here)."""
    outcome = start("test.chain", {"n": 1}, execution_id="path-later", start_at=now() + timedelta(hours=1))
    assert outcome.status == "waiting"
    assert placements.count("path-later") == 1
    cancel("path-later")  # cancel is an entry point of its own: it places the id for itself
    assert Execution.objects.get(pk="path-later").status == "cancelled"


def test_a_second_start_of_an_id_is_refused_naming_the_header_read_on_the_bound_shard(placements, coalescing):
    """The refused bootstrap's ExecutionExists reads the header where the bootstrap was refused."""
    start("test.chain", {"n": 1}, execution_id="path-twice")
    placements.clear()
    with pytest.raises(ExecutionExists) as refused:
        start("test.chain", {"n": 1}, execution_id="path-twice")
    assert refused.value.status == "completed"
    assert placements.count("path-twice") == 1


def test_a_scheduled_start_is_one_write_then_its_wait_row_both_the_writers(writes):
    start("test.chain", {"n": 1}, execution_id="path-sched", start_at=now() + timedelta(hours=1))
    assert writes == [("path-sched", [ev.EXECUTION_STARTED], None, None, None), ("path-sched", "park", "start")]
    cancel("path-sched")


def test_a_run_that_waits_writes_its_events_then_its_wait_row_through_the_writer(writes):
    assert start("waits.sleeper", {"seconds": 3600}, execution_id="path-sleeps").status == "waiting"
    *events, last = [call for call in writes if call[0] == "path-sleeps"]
    assert last == ("path-sleeps", "park", "sleep")
    assert ev.WAIT_STARTED in events[-1][1]  # the wait's event is written before its row
    assert all(call[1] != "park" for call in events)
    assert Execution.objects.get(pk="path-sleeps").status == "waiting"
    cancel("path-sleeps")


def test_a_childs_settle_wakes_its_parent_in_the_one_write_of_its_settle(writes):
    assert start("waits.parent", {"n": 2}, execution_id="path-parent").status == "waiting"
    drain()
    child = "path-parent.child-0"
    settles = [call for call in writes if call[0] == child and len(call) == 5 and call[2]]
    assert len(settles) == 1 and settles[0][2:] == ("completed", "path-parent", None)
    assert settles[0][1][-1] == ev.EXECUTION_COMPLETED
    assert Execution.objects.get(pk="path-parent").status == "completed"


def test_a_run_that_continues_carries_its_messages_in_the_one_write_of_its_settle(writes):
    start("waits.accumulator", 0, execution_id="path-acc")
    send("path-acc", "add", 1, message_id="path-m1")
    send("path-acc", "add", 2, message_id="path-m2")  # unconsumed by the first run: carried to the next
    drain()
    settles = [call for call in writes if call[0] == "path-acc" and len(call) == 5 and call[2]]
    assert len(settles) == 1 and settles[0][2:] == ("completed", None, "path-acc~1")
    assert settles[0][1][-1] == ev.EXECUTION_CONTINUED
    send("path-acc", "add", "stop", message_id="path-stop")
    drain()
    assert Execution.objects.get(pk="path-acc~2").result == 3
