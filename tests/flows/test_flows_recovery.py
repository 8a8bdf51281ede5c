"""Recovery of an orphaned execution by the leases sweep: the takeover advances the fence ONCE and the
resume that follows runs under that very token (it does not advance the fence a second time)."""

from __future__ import annotations

import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.utils import timezone

from journal.envelopes import Envelope
from journal.flows import NotResumable, resume
from journal.flows.ownership import get_ownership, set_ownership
from journal.models import Event, Execution, Fence
from leases.keeper import LeaseKeeper, get_keeper, reset_keeper
from leases.models import Lease
from leases.ownership import install
from leases.recovery import OrphanReach, RecoveryService, sweep
from tests.fixtures import lease_flows  # noqa: F401  (registers the flows)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def orphan_rules(settings):
    """Eager leases, no lazy grace; a TTL long enough that a slow resume keeps the lease its takeover
    wrote (a second takeover would be a second advance, for another reason)."""
    settings.LOOM_LEASE_MODE = "eager"
    settings.LOOM_LEASE_TTL = 10.0
    settings.LOOM_LEASE_RENEW_EVERY = 0.5
    settings.LOOM_LEASE_LAZY_GRACE = 0.0
    settings.LOOM_RECOVERY_EVERY = 0.05
    installed = get_ownership()
    keeper = LeaseKeeper()  # this test's own, so that its thread is stopped with the test
    reset_keeper(keeper)
    install("eager")
    yield
    keeper.shutdown()
    set_ownership(installed)
    reset_keeper(None)


def orphan(eid: str) -> str:
    """A running execution whose owner died after its bootstrap (fence 1, its header, no lease)."""
    Event.objects.open_stream(eid, [Envelope("EXECUTION_STARTED", {"flow": "leases.noop", "input": {}}),
                                    Envelope("STEP_STARTED", {"step": "noop", "pos": 0, "attempt": 1})])
    # Last updated longer ago than grace + TTL: the sweep's orphan rule.
    Execution.objects.create(id=eid, flow="leases.noop")
    Execution.objects.filter(pk=eid).update(updated_at=timezone.now() - timedelta(minutes=5))
    return eid


def wait_until(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def recovered_by(eid: str) -> dict:
    return next(e.payload["recovered_by"] for e in Event.objects.read(eid) if "recovered_by" in e.payload)


def test_one_recovery_by_the_backstop_task_advances_the_fence_once(monkeypatch):
    """leases.tasks.recovery_sweep: takeover (fence 1 -> 2), then the resume runs at fence 2 and settles."""
    from leases import tasks
    from leases.tasks import recovery_sweep

    monkeypatch.setattr(tasks, "BACKSTOP_REACH", OrphanReach())  # this process's first backstop: a full pass
    orphan("rec-1")
    assert recovery_sweep() == 1
    assert Execution.objects.get(pk="rec-1").status == "completed"
    assert Fence.objects.current("rec-1") == 2  # old + 1, not + 2
    assert recovered_by("rec-1")["fence"] == 2
    wait_until(lambda: not Lease.objects.filter(execution_id="rec-1").exists())  # the keeper's group release


def test_one_recovery_by_the_worker_service_advances_the_fence_once():
    """The worker's recovery thread: the same single advance for what its sweep took over."""
    orphan("rec-2")
    service = RecoveryService()
    service.start(SimpleNamespace(worker_id=get_keeper().worker_id))  # a worker's keeper and sweep share its id
    try:
        wait_until(lambda: Execution.objects.get(pk="rec-2").status == "completed")
    finally:
        service.stop(5)
    assert Fence.objects.current("rec-2") == 2
    assert recovered_by("rec-2") == {"by": recovered_by("rec-2")["by"], "fence": 2}


def test_an_orphan_older_than_the_sweeps_window_is_taken_by_the_full_orphan_pass(settings):
    """A sweep with a memory of its previous ones (OrphanReach) looks for orphans only among the headers
    that passed the grace since then: an orphan whose header passed it long before (its lease row deleted
    under it, say) is not seen by that window, and is taken by the next full orphan pass."""
    settings.LOOM_RECOVERY_FULL_EVERY = 3600.0
    reach, owner = OrphanReach(), get_keeper().worker_id
    assert reach.window("default") is None
    assert sweep(owner, alias="default", reach=reach).taken == []  # the first: a full pass, nothing to take
    assert reach.window("default") is not None
    orphan("rec-old")  # header 5 minutes old: past the grace long before the last sweep
    assert sweep(owner, alias="default", reach=reach).taken == []  # the window does not reach it
    settings.LOOM_RECOVERY_FULL_EVERY = 0.0  # the full pass is due
    assert reach.window("default") is None
    assert sweep(owner, alias="default", reach=reach).taken == [("rec-old", 2)]


def test_the_worker_service_runs_the_full_orphan_pass_again_after_its_first(settings):
    """The recovery thread's first sweep is a full orphan pass, and so is one every
    LOOM_RECOVERY_FULL_EVERY seconds: an orphan whose header is older than every window, appearing after
    the service's first sweep, is still recovered."""
    settings.LOOM_RECOVERY_FULL_EVERY = 0.2
    service = RecoveryService()
    service.start(SimpleNamespace(worker_id=get_keeper().worker_id))
    try:
        wait_until(lambda: service.reach.window("default") is not None)  # the first full pass completed
        orphan("rec-late")
        wait_until(lambda: Execution.objects.get(pk="rec-late").status == "completed")
    finally:
        service.stop(5)
    assert Fence.objects.current("rec-late") == 2


def test_a_resume_with_a_token_taken_over_since_is_refused_and_writes_nothing():
    """A sweep's token that is no longer the fence (someone took the execution over in between) is
    not resumed: NotResumable, nothing written, the fence stays with whoever advanced it."""
    orphan("rec-3")
    result = sweep(get_keeper().worker_id)
    assert result.taken == [("rec-3", 2)]
    Fence.objects.advance("rec-3")  # another takeover meanwhile: fence 3
    before = [e.seq for e in Event.objects.read("rec-3")]
    with pytest.raises(NotResumable, match="fence"):
        resume("rec-3", token=2)
    assert [e.seq for e in Event.objects.read("rec-3")] == before
    assert Fence.objects.current("rec-3") == 3
