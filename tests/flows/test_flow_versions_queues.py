"""Version-aware queue dispatch (docs/queues.md "How workers dequeue", docs/flows.md "Versions and deploys"):
a queued execution is pinned to the version it was enqueued on, a dispatcher claims only entries of the
(flow, version) pairs its process registers, and a claimed entry runs that version or nothing. In-process,
both databases; two real workers of two releases are in tests/flows/test_flow_versions_processes.py."""

from __future__ import annotations

import pytest

from journal.flows import hand_over, registry, start
from journal.flows.ownership import get_ownership, set_ownership
from journal.flows.queued import ELSEWHERE, run_queued
from journal.models import Execution, Fence
from queues import enqueue, run_due
from queues.models import QueueEntry
from queues.service import run_claimed
from queues.store import store_for
from tests.fixtures import version_flows_v1, version_flows_v2, version_queued_v1, version_queued_v2  # noqa: F401
from tests.fixtures.version_common import create_effects_table, drop_effects_table, effects
from tests.flows.test_flow_versions import release

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def parked(settings):
    """Every wait parks; this process keeps no leases; the effects table exists."""
    settings.LOOM_WAIT_INLINE_MAX = 0.0
    installed = get_ownership()
    set_ownership(None)
    create_effects_table()
    yield
    drop_effects_table()
    set_ownership(installed)


def entry(eid: str) -> tuple:
    row = QueueEntry.objects.get(execution_id=eid)
    return row.state, row.attempts, row.worker, row.begun_at


def test_a_dispatcher_with_only_version_2_claims_nothing_of_a_version_1_entry():
    """Before: the dispatcher filtered by flow name only, so a release-2 worker claimed the version-1 entry
    and ran it on version 2 (the newest it had)."""
    with release("ver.queued", 1):
        old = enqueue("ver.queued", {"n": 10}, execution_id="vq-1").execution_id
    assert Execution.objects.get(pk=old).flow_version == 1
    store = store_for()
    with release("ver.queued", 2):
        flows = registry.runnable()
        assert ("ver.queued", 2) in flows and ("ver.queued", 1) not in flows
        assert run_due() == []
        assert store.ready_queues(flows, 3600.0) == []
        assert store.dequeue("default", "w2", 10, flows, 3600.0) == []
        new = enqueue("ver.queued", {"n": 20}, execution_id="vq-2").execution_id
        assert run_due() == ["completed"]  # its own version-2 start only
    assert entry(old) == ("pending", 0, "", None)  # untouched: never claimed
    assert Execution.objects.get(pk=old).status == "queued" and Fence.objects.current(old) == 1
    with release("ver.queued", 1):
        assert run_due() == ["completed"]
    results = dict(Execution.objects.values_list("id", "result"))
    assert results[old]["version"] == 1 and results[new]["version"] == 2
    assert [(eid, version) for eid, version, _ in effects()] == [(old, 1), (new, 2)]


def test_a_deferred_version_1_entry_does_not_shorten_a_version_2_dispatchers_sleep():
    from datetime import timedelta

    from django.utils import timezone

    with release("ver.queued", 1):
        enqueue("ver.queued", {"n": 1}, execution_id="vq-later", run_after=timezone.now() + timedelta(minutes=5))
    store = store_for()
    with release("ver.queued", 2):
        assert store.next_due(registry.runnable()) is None
    with release("ver.queued", 1):
        assert 0 < store.next_due(registry.runnable()) <= 300


def test_a_claim_of_a_version_this_process_lacks_runs_nothing_and_is_offered_again():
    """A race with a deploy: an entry claimed by name (any version) in a process without its version. The
    runner changes nothing, not even the begin, so the claim is offered again after the claim timeout."""
    with release("ver.queued", 1):
        eid = enqueue("ver.queued", {"n": 3}, execution_id="vq-race").execution_id
    store = store_for()
    (claimed,) = store.dequeue("default", "w2", 10, ["ver.queued"], 3600.0)  # by name: any version
    asked = []
    with release("ver.queued", 2):
        assert run_queued(eid, "ver.queued", lambda: asked.append(1) or True) == ELSEWHERE
        assert run_claimed(claimed) == "elsewhere"
    assert asked == [] and entry(eid)[::3] == ("started", None)  # claimed by w2, never begun
    assert Execution.objects.get(pk=eid).status == "queued" and Fence.objects.current(eid) == 1
    assert effects() == []
    with release("ver.queued", 1):
        (again,) = store.dequeue("default", "w1", 10, registry.runnable(), 0.0)  # past the claim timeout
        assert (again.execution_id, again.attempts) == (eid, 2)
        assert run_claimed(again) == "completed"
    assert Execution.objects.get(pk=eid).result["version"] == 1


def test_a_handed_over_resume_of_a_version_1_execution_is_left_to_a_worker_that_has_version_1():
    """Before: a release-2 dispatcher claimed the resume entry by name, began it, and resume() refused with
    UnknownFlow: the entry stayed begun (never offered again) and the execution waited for nobody."""
    with release("ver.order", 1):
        assert start("ver.order", {"n": 1, "wait": "message"}, execution_id="vh-1").status == "waiting"
    token = hand_over("vh-1")
    store = store_for()
    with release("ver.order", 2):
        assert store.dequeue("default", "w2", 10, registry.runnable(), 3600.0) == []  # not claimed by version
        (claimed,) = store.dequeue("default", "w2", 10, ["ver.order"], 3600.0)  # the race: claimed by name
        assert claimed.resume_fence == token
        assert run_claimed(claimed) == "elsewhere"
    assert entry("vh-1")[::3] == ("started", None) and Fence.objects.current("vh-1") == token
    with release("ver.order", 1):
        (again,) = store.dequeue("default", "w1", 10, registry.runnable(), 0.0)
        assert run_claimed(again) == "waiting"  # resumed on version 1: back to its recv
    assert Fence.objects.current("vh-1") == token + 1
    assert Execution.objects.get(pk="vh-1").error == ""
