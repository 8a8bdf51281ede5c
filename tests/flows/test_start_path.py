"""The path of an execution id from start() to its journal writes (docs/architecture.md, "The path of an
execution id"): the execution's shard is asked for once, where the start begins, and everything below (the
unseal, the scheduled write, the run's writes, its lease, a halted run's header read) works on the binding."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings

from journal import coalesce, shards
from journal.flows import ExecutionExists, cancel, start
from journal.flows.context import now
from journal.models import Execution
from tests.fixtures import flows_fixtures  # noqa: F401  (registers the flows)

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
