"""A run's lease row goes when its execution stops being run, on either database (issue 24): a cancel
deletes it in its own transaction (a run live on another thread is fenced off and does not write it
again), a completion or a failure releases it even when the process exits right after, and the recovery
service prunes what a crash left behind. Before, a cancelled execution kept its row forever: the Leases
page listed cancelled runs ("expired 699.0 s ago") and `loom executions show` printed their lease."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connections

from journal.envelopes import Envelope
from journal.flows import cancel, flow, start
from journal.flows.ownership import get_ownership, set_ownership
from journal.models import Event, Execution
from leases.keeper import LeaseKeeper, reset_keeper
from leases.models import Lease
from leases.ownership import LeaseOwnership
from leases.recovery import prune_workers
from leases.store import store_for
from tests.conftest import run_child
from tests.fixtures import lease_flows  # noqa: F401  (registers the flows the child processes run)

pytestmark = pytest.mark.django_db(transaction=True)

GATE = threading.Event()
IN_STEP = threading.Event()


@flow("leases_release.gated")
def gated(ctx, value):
    """A first step that holds until the test opens the gate, then a second: a run live on this thread."""

    def hold() -> int:
        IN_STEP.set()
        assert GATE.wait(30)
        return 1

    ctx.step("hold", hold)
    ctx.step("after", lambda: 2)
    return 3


@pytest.fixture(autouse=True)
def short_leases(settings):
    settings.LOOM_LEASE_TTL = 2.0
    settings.LOOM_LEASE_RENEW_EVERY = 0.1
    settings.LOOM_LEASE_LAZY_GRACE = 0.1
    settings.LOOM_LEASE_MODE = "lazy"
    GATE.clear()
    IN_STEP.clear()
    installed = get_ownership()
    yield
    GATE.set()
    set_ownership(installed)
    reset_keeper(None)


def wait_until(predicate, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for: {what}")
        time.sleep(0.02)


def lease_rows(eid: str) -> list[tuple]:
    return list(Lease.objects.filter(execution_id=eid).values_list("owner", "fence_token"))


@pytest.mark.parametrize("mode", ["lazy", "eager"])
def test_a_cancel_deletes_the_lease_of_a_run_live_on_another_thread_and_the_run_does_not_write_it_again(mode):
    """The run holds its lease (lazy past the grace, or eager) while a step runs; the cancel deletes the row
    in its own transaction, before the run has even noticed. The fenced-off run goes on to its next write,
    is refused, stops as cancelled; its keeper keeps ticking: the row never comes back."""
    keeper = LeaseKeeper("owner-node")
    set_ownership(LeaseOwnership(mode, keeper))
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["o"] = start("leases_release.gated", {}, execution_id="rel-live")
        finally:
            connections.close_all()

    runner = threading.Thread(target=run)
    runner.start()
    try:
        assert IN_STEP.wait(20)
        wait_until(lambda: lease_rows("rel-live") == [("owner-node", 1)], "the run's lease")
        assert cancel("rel-live", "by the test").status == "cancelled"
        assert lease_rows("rel-live") == []  # gone with the cancel's commit, the run still in its step
    finally:
        GATE.set()
        runner.join(30)
    assert outcome["o"].status == "cancelled"
    ticks = keeper.ticks
    wait_until(lambda: keeper.ticks >= ticks + 3, "three more keeper ticks")
    assert keeper.drain()
    assert lease_rows("rel-live") == [] and not keeper.holding()
    assert Execution.objects.get(pk="rel-live").status == "cancelled"
    keeper.shutdown()


def test_a_cancel_deletes_the_lease_row_a_dead_owner_left():
    """An owner that died holding the lease (its row stays, nobody renews it): the cancel removes it too."""
    Event.objects.open_stream("rel-dead", Envelope("EXECUTION_STARTED", {"flow": "leases.noop", "input": {}}))
    Execution.objects.create(id="rel-dead", flow="leases.noop")
    dead = LeaseKeeper("dead-node", autostart=False)
    dead.begin_eager("rel-dead", 1, wait=False)
    dead.step()
    assert lease_rows("rel-dead") == [("dead-node", 1)]
    assert cancel("rel-dead").status == "cancelled"
    assert lease_rows("rel-dead") == []


@pytest.mark.parametrize("how", ["completed", "failed"])
def test_a_settled_run_in_a_process_that_exits_at_once_leaves_no_lease_row(child_env, how):
    """A script (or a command) runs one long leased flow and exits as soon as it settled: its lease is released
    (before, the release waited in the keeper's queue for its group commit and was lost with the process on
    SQLite, the row then staying forever)."""
    child_env.update({"LOOM_LEASE_MODE": "lazy", "LOOM_LEASE_LAZY_GRACE": "0.1", "LOOM_LEASE_TTL": "30",
                      "LOOM_LEASE_RENEW_EVERY": "0.1"})
    name = "leases.sleepy" if how == "completed" else "leases.sleep_then_fail"
    code = ("from journal.flows import start\nfrom tests.fixtures import lease_flows\n"
            f"print(start({name!r}, {{'seconds': 0.6}}, execution_id='rel-{how}').status)\n")
    out = run_child(code, child_env).stdout.split()
    assert out[-1] == how
    assert Execution.objects.get(pk=f"rel-{how}").status == how
    assert lease_rows(f"rel-{how}") == []


def test_the_recovery_service_prunes_expired_leases_of_executions_no_run_holds():
    """What a crash left (a release lost with its process, an acquire that raced a cancel): expired rows of
    settled or parked executions are pruned; a running or stuck execution's row, or an unexpired one, is not."""
    keeper = LeaseKeeper("gone-node", autostart=False)
    statuses = {"p-done": "completed", "p-failed": "failed", "p-cancelled": "cancelled", "p-waiting": "waiting",
                "p-run": "running", "p-stuck": "stuck", "p-fresh": "completed"}
    for eid, status in statuses.items():
        Event.objects.open_stream(eid, Envelope("EXECUTION_STARTED", {"flow": "leases.noop", "input": {}}))
        Execution.objects.create(id=eid, flow="leases.noop", status=status)
        keeper.begin_eager(eid, 1, wait=False)
    keeper.step()
    assert Lease.objects.count() == len(statuses)
    store_for().expire_many("gone-node", [(eid, 1) for eid in statuses if eid != "p-fresh"])
    prune_workers()
    assert sorted(Lease.objects.values_list("execution_id", flat=True)) == ["p-fresh", "p-run", "p-stuck"]


OWNER = """
import time
from journal.flows import start
from leases.keeper import get_keeper
from leases.models import Lease
from leases.worker import HeartbeatService, Worker
w = Worker("owner-proc", services=[HeartbeatService])
w.start()
print("OUTCOME", start("leases.gated", {args!r}, execution_id={eid!r}).status, flush=True)
ticks = get_keeper().ticks
while get_keeper().ticks < ticks + 5:  # its keeper goes on renewing after the run stopped
    time.sleep(0.05)
print("ROWS", Lease.objects.filter(execution_id={eid!r}).count(), flush=True)
w.stop(5)
"""


@pytest.mark.parametrize("mode", ["lazy", "eager"])
def test_a_cancel_deletes_the_lease_of_a_run_live_in_another_process_which_does_not_write_it_again(
        child_env, tmp_path, mode):
    """The owner is another process (its keeper thread renewing every 0.1 s), its run inside a step: the cancel
    deletes the row at once; the run, fenced off, stops as cancelled at its next write, and its keeper ticks on
    without the row coming back, until the process stops."""
    from tests.conftest import spawn_child

    child_env.update({"LOOM_LEASE_MODE": mode, "LOOM_LEASE_LAZY_GRACE": "0.1", "LOOM_LEASE_TTL": "30",
                      "LOOM_LEASE_RENEW_EVERY": "0.1", "LOOM_FLOW_MODULES": "tests.fixtures.lease_flows"})
    args = {"marker": str(tmp_path / "running"), "release": str(tmp_path / "release")}
    owner = spawn_child(OWNER.format(args=args, eid="rel-proc"), child_env)
    try:
        wait_until(lambda: (tmp_path / f"running.{owner.pid}").exists()
                   and lease_rows("rel-proc") == [("owner-proc", 1)], "the other process runs the step, leased")
        assert cancel("rel-proc", "by the test").status == "cancelled"
        assert lease_rows("rel-proc") == []
        (tmp_path / "release").write_text("go")
        out, err = owner.communicate(timeout=60)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.communicate()
    assert "OUTCOME cancelled" in out and "ROWS 0" in out, (out, err)
    assert lease_rows("rel-proc") == []
    assert Execution.objects.get(pk="rel-proc").status == "cancelled"
