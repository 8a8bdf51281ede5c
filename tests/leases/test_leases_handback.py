"""A lease handed back by a graceful shutdown is no recovery attempt: its takeover neither counts toward
LOOM_RECOVERY_MAX_ATTEMPTS nor marks the execution stuck, while a lease that lapsed (its worker died) still counts
and still ends stuck at the max. In process, on either database: the runs stop at step boundaries as under SIGTERM
(leases.keeper.begin_drain), the keeper hands their leases back, and the backstop sweep (leases.tasks.recovery_sweep)
takes them over and resumes them. tests/leases/test_shutdown_rolling_deploys.py does the same with real processes."""

from __future__ import annotations

import time
import uuid

import pytest
from django.utils import timezone

from journal.flows import ShuttingDown, start
from journal.flows.ownership import get_ownership, set_ownership
from journal.models import Execution, Fence
from leases import conf
from leases.keeper import LeaseKeeper, end_drain, reset_keeper
from leases.models import Lease
from leases.ownership import install
from leases.store import store_for
from tests.fixtures import lease_flows

pytestmark = pytest.mark.django_db(transaction=True)

HANDBACKS = 10


@pytest.fixture(autouse=True)
def rules(settings, monkeypatch):
    """Eager leases with a TTL no test reaches (a takeover here is of a handed-back or a lapsed lease, never of one
    that expired on its own); this test's own keeper; the backstop's first sweep a full pass."""
    from leases import tasks
    from leases.recovery import OrphanReach

    settings.LOOM_LEASE_MODE = "eager"
    settings.LOOM_LEASE_TTL = 300.0
    settings.LOOM_LEASE_RENEW_EVERY = 100.0
    settings.LOOM_LEASE_LAZY_GRACE = 0.0
    monkeypatch.setattr(tasks, "BACKSTOP_REACH", OrphanReach())
    lease_flows.create_effects_table()
    installed = get_ownership()
    keeper = LeaseKeeper()
    reset_keeper(keeper)
    install("eager")
    yield keeper
    end_drain()
    keeper.shutdown()
    set_ownership(installed)
    reset_keeper(None)


def wait_until(predicate, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for: {what}"
        time.sleep(0.02)


def handed_back(eid: str) -> bool:
    """The run stopped at its step boundary and the keeper expired its lease (handed it back)."""
    return Lease.objects.filter(execution_id=eid, expires_at__lte=timezone.now()).exists()


def as_if_its_worker_died(eid: str) -> None:
    """Replace the lease by the one a worker that died leaves: held by a gone owner at the current fence, lapsed
    long ago (a run killed, or paused past its TTL), never handed back."""
    store = store_for()
    assert store.drop_lease(eid) == 1
    store.fill_leases("dead-node", [eid], Fence.objects.current(eid), expires_in=-100.0)


def take_over(eid: str) -> None:
    """One sweep of a worker that is not shutting down: it takes the execution over and resumes it here, and the
    resumed run stops after one step, as its worker begins to shut down."""
    from leases.tasks import recovery_sweep

    end_drain()
    recovery_sweep()


def steps_run(eid: str) -> list[str]:
    return [step for e, step in lease_flows.effects() if e == eid]


def test_hand_backs_are_no_recovery_attempts_and_lapsed_leases_still_end_stuck_at_the_max():
    eid = f"hb-{uuid.uuid4().hex[:8]}"
    limit = conf.get("LOOM_RECOVERY_MAX_ATTEMPTS")
    assert limit < HANDBACKS  # the default (5): more hand-backs than the recoveries allowed
    with pytest.raises(ShuttingDown):
        start("leases.stop_after_each_step", {"n": 40}, execution_id=eid)
    for i in range(HANDBACKS):
        wait_until(lambda: handed_back(eid), f"hand-back {i}")
        take_over(eid)
        execution = Execution.objects.get(pk=eid)
        assert (execution.status, execution.recoveries) == ("running", 0), (i, execution.status, execution.error)
    # Each takeover continued where the last run stopped: one step each, none twice.
    assert steps_run(eid) == [f"s{i:03d}" for i in range(HANDBACKS + 1)]

    # A lapsed lease (its worker died) still counts: LOOM_RECOVERY_MAX_ATTEMPTS of them are recovered...
    for attempt in range(1, limit + 1):
        wait_until(lambda: handed_back(eid), f"hand-back before crash {attempt}")
        as_if_its_worker_died(eid)
        take_over(eid)
        execution = Execution.objects.get(pk=eid)
        assert (execution.status, execution.recoveries) == ("running", attempt), (attempt, execution.error)
    # ... a hand-back at the max is still taken over, not counted (the run it continues was healthy) ...
    wait_until(lambda: handed_back(eid), "a hand-back at the max")
    take_over(eid)
    execution = Execution.objects.get(pk=eid)
    assert (execution.status, execution.recoveries) == ("running", limit)
    # ... and the next lapsed lease ends it stuck, at the max.
    wait_until(lambda: handed_back(eid), "the last hand-back")
    as_if_its_worker_died(eid)
    take_over(eid)
    execution = Execution.objects.get(pk=eid)
    assert execution.status == "stuck" and f"{limit} attempts" in execution.error, execution.error
    assert execution.recoveries == limit
    assert not Lease.objects.filter(execution_id=eid).exists()
    assert steps_run(eid) == [f"s{i:03d}" for i in range(HANDBACKS + limit + 2)]


def test_only_a_run_stopped_at_a_step_boundary_hands_its_lease_back_marked(rules):
    """The keeper's three hand-backs: a run that stopped at its boundary while draining (abandon(graceful=True))
    and a lazy claim within its grace that did (a row written expired) are marked; a step whose heartbeat timed
    out (the watchdog's hand_back()) is not: its takeover counts, as after a crash."""
    from leases.keeper import begin_drain
    from tests.leases.test_leases import running

    keeper = rules
    ids = [running(f"hbk-{uuid.uuid4().hex[:6]}-{kind}") for kind in ("boundary", "lazy", "silent")]
    boundary = keeper.begin_eager(ids[0], 1)
    lazy = keeper.begin_lazy(ids[1], 1)
    silent = keeper.begin_eager(ids[2], 1)
    begin_drain()
    boundary.abandon(graceful=True)
    lazy.abandon(graceful=True)
    silent.hand_back()
    wait_until(lambda: Lease.objects.filter(execution_id__in=ids, expires_at__lte=timezone.now()).count() == 3,
               "three hand-backs")
    assert dict(Lease.objects.filter(execution_id__in=ids).values_list("execution_id", "handed_back")) == {
        ids[0]: True, ids[1]: True, ids[2]: False}
    end_drain()
    result = store_for().takeover("b", ttl=30, orphan_after=3600, max_attempts=5, limit=10)
    assert sorted(result.taken) == [(eid, 2) for eid in sorted(ids)]
    assert result.handed_back == sorted(ids[:2])
