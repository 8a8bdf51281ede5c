"""A run that halts with its execution still running (its write failed) leaves its lease to lapse, so the
next recovery sweep takes the execution over by its expired lease. It used to delete the lease row: the
execution was then running, unleased, and older than the windowed sweeps' orphan window (a running
header's updated_at is its start), so only the full pass (LOOM_RECOVERY_FULL_EVERY, 600 s) found it
(review r2, F1). Real runs and leases, on both backends; the failing write is the one thing simulated."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import DatabaseError

from journal.flows import start, writer
from journal.models import Execution
from leases.models import Lease
from leases.recovery import OrphanReach, sweep
from tests.fixtures import lease_flows  # noqa: F401  (registers leases.noop)
from tests.leases.test_leases import short_leases  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.usefixtures("short_leases")
def test_a_run_whose_write_failed_keeps_its_lease_to_lapse_and_the_windowed_sweep_takes_it(settings, monkeypatch):
    from leases.keeper import get_keeper
    from leases.ownership import install

    settings.LOOM_LEASE_MODE = "eager"  # the lease row is written with the run's bootstrap
    install("eager")
    try:
        _halt_and_recover(monkeypatch)
    finally:
        get_keeper().shutdown()  # its thread must not outlive the test (it would tick into the next one)


def _halt_and_recover(monkeypatch) -> None:
    reach = OrphanReach()
    assert sweep("sweeper", reach=reach).taken == []  # the worker's start: its full pass, complete
    real = writer.write

    def failing(run, envelopes, settle=None):
        if any(e.type == "STEP_COMPLETED" for e in envelopes):
            raise DatabaseError("the server went away")  # the step's write fails: the run halts
        return real(run, envelopes, settle)

    monkeypatch.setattr(writer, "write", failing)
    with pytest.raises(DatabaseError):  # the caller hears of it; the execution stays running
        start("leases.noop", {}, execution_id="halted-1")
    monkeypatch.setattr(writer, "write", real)
    assert Execution.objects.get(pk="halted-1").status == "running"
    from leases.keeper import get_keeper

    get_keeper().drain()  # whatever the keeper queued is written: a release would delete the row now
    assert Lease.objects.filter(execution_id="halted-1").exists(), "the halted run's lease row was deleted"
    # A long run: its header is older than any orphan window; its lease lapses (no one renews it).
    Execution.objects.filter(pk="halted-1").update(updated_at=datetime.now(UTC) - timedelta(minutes=5))
    Lease.objects.filter(execution_id="halted-1").update(expires_at=datetime.now(UTC) - timedelta(seconds=1))
    taken = sweep("sweeper", reach=reach).taken  # a windowed sweep, not a full pass
    assert [eid for eid, _ in taken] == ["halted-1"]
