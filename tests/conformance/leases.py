"""The lease store contract: leases fenced by owner and token, expiry, takeover that advances the fence."""

from __future__ import annotations

import pytest

from journal.envelopes import AppendItem, Envelope
from journal.exceptions import StaleFence
from journal.models import Execution
from journal.store import store_for as journal_store_for
from leases.models import Lease, Worker
from tests.conformance import StoreContract
from tests.conformance.schedules import COVERS as SCHEDULE_COVERS
from tests.conformance.schedules import SchedulesContract

TTL = 30.0
LONG = 3600.0  # an orphan_after no execution of a test reaches


def running(eid: str, flow: str = "conformance.flow", recoveries: int = 0) -> str:
    """A running execution: its stream opened (fence token 1) and its header row."""
    journal_store_for().open_stream(AppendItem(eid, (Envelope("EXECUTION_STARTED", {"flow": flow}),)))
    Execution.objects.create(id=eid, flow=flow, recoveries=recoveries)
    return eid


def holder(eid: str) -> tuple[str, int] | None:
    lease = Lease.objects.filter(execution_id=eid).first()
    return None if lease is None else (lease.owner_id, lease.fence_token)


class LeaseStoreContract(SchedulesContract, StoreContract):
    """What every lease backend does (leases.store.base.LeaseStore). Real commits: the backends read
    the database's clock per statement, so expiry is observed across statements, not inside one."""

    pytestmark = pytest.mark.django_db(transaction=True)

    @staticmethod
    def app_store_for(alias: str = "default"):
        from leases.store import store_for

        return store_for(alias)

    covers = {
        "acquire_many": "acquire_many", "renew_many": "renew_many", "release_many": "release_many",
        "expire_many": "expire_many", "takeover": "takeover", "touch_worker": "touch_worker",
        "prune_workers": "prune_workers", "stop_worker": "stop_worker",
        "count_leases": "count_leases", "delete_leases": "delete_leases",
        "reserve_start": "reserve_start", "reservation": "reservation",
        "release_reservation": "release_reservation", "prune_reservations": "prune_reservations",
        "reserved_ids": "reserved_ids",
        **SCHEDULE_COVERS,  # tests/conformance/schedules.py
    }

    # -- acquire --------------------------------------------------------------------------------
    def test_acquire_leases_at_the_current_fence_token(self, store):
        running("x")
        assert store.acquire_many("a", [("x", 1)], TTL) == {"x"}
        assert holder("x") == ("a", 1)

    def test_acquire_at_a_stale_or_unfenced_token_is_refused(self, store):
        running("x")
        journal_store_for().advance_fence("x")
        assert store.acquire_many("a", [("x", 1), ("nofence", 1)], TTL) == set()
        assert store.acquire_many("a", [("x", 2)], TTL) == {"x"}
        assert holder("x") == ("a", 2) and holder("nofence") is None

    def test_a_held_lease_is_refused_to_another_owner_and_refreshed_for_its_own(self, store):
        running("x")
        store.acquire_many("a", [("x", 1)], TTL)
        assert store.acquire_many("b", [("x", 1)], TTL) == set()
        assert store.acquire_many("a", [("x", 1)], TTL) == {"x"}
        assert holder("x") == ("a", 1)

    def test_a_higher_token_supersedes_the_holder(self, store):
        running("x")
        store.acquire_many("a", [("x", 1)], TTL)
        journal_store_for().advance_fence("x")
        assert store.acquire_many("b", [("x", 2)], TTL) == {"x"}
        assert holder("x") == ("b", 2)
        assert store.renew_many("a", [("x", 1)], TTL) == set()

    def test_releases_ride_along_with_an_acquire(self, store):
        running("x"), running("y")
        store.acquire_many("a", [("x", 1)], TTL)
        assert store.acquire_many("a", [("y", 1)], TTL, release=[("x", 1)]) == {"y"}
        assert holder("x") is None and holder("y") == ("a", 1)
        assert store.acquire_many("a", [], TTL, release=[("y", 1)]) == set()
        assert holder("y") is None

    # -- renew / release / expire ---------------------------------------------------------------
    def test_renew_returns_only_the_leases_the_owner_still_holds_at_that_token(self, store):
        for eid in ("x", "y", "z"):
            running(eid)
        store.acquire_many("a", [("x", 1), ("y", 1)], TTL)
        store.acquire_many("b", [("z", 1)], TTL)
        before = Lease.objects.get(execution_id="x").expires_at
        assert store.renew_many("a", [("x", 1), ("y", 2), ("z", 1)], TTL * 2) == {"x"}
        assert Lease.objects.get(execution_id="x").expires_at > before
        assert store.renew_many("a", [], TTL) == set()

    def test_release_deletes_only_the_owners_leases_at_their_tokens(self, store):
        for eid in ("x", "y"):
            running(eid)
        store.acquire_many("a", [("x", 1)], TTL)
        store.acquire_many("b", [("y", 1)], TTL)
        assert store.release_many("a", [("x", 2), ("y", 1)]) == 0
        assert store.release_many("a", [("x", 1)]) == 1
        assert holder("x") is None and holder("y") == ("b", 1)
        assert store.release_many("a", []) == 0

    def test_an_expired_lease_is_taken_over_at_once(self, store):
        running("x")
        store.acquire_many("a", [("x", 1)], TTL)
        assert store.takeover("b", TTL, LONG, 5, 10).taken == []
        assert store.expire_many("b", [("x", 1)]) == 0  # not b's to expire
        assert store.expire_many("a", [("x", 1)]) == 1
        assert store.takeover("b", TTL, LONG, 5, 10).taken == [("x", 2)]

    # -- takeover -------------------------------------------------------------------------------
    def test_takeover_moves_the_lease_advances_the_fence_and_counts_the_recovery(self, store):
        running("x", flow="f.one")
        store.acquire_many("a", [("x", 1)], -1.0)  # already expired
        result = store.takeover("b", TTL, LONG, 5, 10)
        assert result.taken == [("x", 2)] and result.stuck == [] and result.flow_of == {"x": "f.one"}
        assert holder("x") == ("b", 2)
        assert journal_store_for().current_fence("x") == 2
        # The recovery counts once the taking run reached the database (count_recovery, under its fence), not
        # in the takeover: a takeover whose run cannot connect is no attempt of the flow (#35).
        assert Execution.objects.get(id="x").recoveries == 0
        assert journal_store_for().count_recovery("x", 1) is False
        assert journal_store_for().count_recovery("x", 2) is True
        assert Execution.objects.get(id="x").recoveries == 1

    def test_a_graceful_hand_back_is_reported_by_the_takeover_and_exempt_from_the_max(self, store):
        """expire_many(graceful=True) (a run stopped at a step boundary) and the TTL-0 acquire of a lazy claim
        that had no row (handed_back=True) mark the lease: the takeover lists it in handed_back (its resume counts
        no recovery) and takes it even at the max; a plain expiry (a step cut off) is an attempt like a lapse."""
        running("x", recoveries=5), running("y", recoveries=5), running("z")
        store.acquire_many("a", [("x", 1), ("y", 1)], TTL)
        assert store.expire_many("a", [("x", 1)], graceful=True) == 1
        assert store.expire_many("a", [("y", 1)]) == 1
        assert store.acquire_many("a", [("z", 1)], 0.0, handed_back=True) == {"z"}
        result = store.takeover("b", TTL, LONG, 5, 10)
        assert (result.taken, result.handed_back, result.stuck) == ([("x", 2), ("z", 2)], ["x", "z"], ["y"])
        assert not Lease.objects.get(execution_id="x").handed_back  # the sweeper holds it now
        assert Execution.objects.get(id="x").recoveries == 5 and Execution.objects.get(id="y").status == "stuck"

    def test_any_later_write_of_a_handed_back_lease_clears_the_mark(self, store):
        running("x")
        store.acquire_many("a", [("x", 1)], TTL)
        store.expire_many("a", [("x", 1)], graceful=True)
        assert Lease.objects.get(execution_id="x").handed_back
        assert store.renew_many("a", [("x", 1)], TTL) == {"x"}  # its owner is alive after all
        assert not Lease.objects.get(execution_id="x").handed_back
        store.expire_many("a", [("x", 1)], graceful=True)
        assert store.acquire_many("a", [("x", 1)], -1.0) == {"x"}  # refreshed, then lapsed: no hand-back
        result = store.takeover("b", TTL, LONG, 5, 10)
        assert result.taken == [("x", 2)] and result.handed_back == []

    def test_the_old_owner_is_fenced_out_after_a_takeover(self, store):
        running("x")
        store.acquire_many("a", [("x", 1)], -1.0)
        store.takeover("b", TTL, LONG, 5, 10)
        assert store.renew_many("a", [("x", 1)], TTL) == set()
        assert store.release_many("a", [("x", 1)]) == 0
        with pytest.raises(StaleFence):
            journal_store_for().append_batch([AppendItem("x", (Envelope("Late"),), fence_token=1)])
        assert store.renew_many("b", [("x", 2)], TTL) == {"x"}

    def test_takeover_leaves_live_leases_alone(self, store):
        running("x")
        store.acquire_many("a", [("x", 1)], TTL)
        assert store.takeover("b", TTL, -60.0, 5, 10).taken == []
        assert holder("x") == ("a", 1) and journal_store_for().current_fence("x") == 1

    def test_an_execution_without_a_lease_is_taken_only_once_orphaned(self, store):
        running("x")
        assert store.takeover("b", TTL, LONG, 5, 10).taken == []
        assert store.takeover("b", TTL, -60.0, 5, 10).taken == [("x", 2)]
        assert holder("x") == ("b", 2)

    def test_takeover_gives_up_after_max_attempts(self, store):
        running("x", recoveries=3)
        store.acquire_many("a", [("x", 1)], -1.0)
        result = store.takeover("b", TTL, LONG, 3, 10)
        assert result.taken == [] and result.stuck == ["x"]
        execution = Execution.objects.get(id="x")
        assert execution.status == "stuck" and "3 attempts" in execution.error
        assert holder("x") is None and journal_store_for().current_fence("x") == 2
        assert store.takeover("b", TTL, -60.0, 3, 10).stuck == []  # no longer running

    def test_takeover_only_touches_running_executions_of_the_given_flows(self, store):
        running("x", flow="f.mine")
        running("y", flow="f.other")
        running("done", flow="f.mine")
        Execution.objects.filter(id="done").update(status="completed")
        result = store.takeover("b", TTL, -60.0, 5, 10, flows=["f.mine"])
        assert result.taken == [("x", 2)]
        assert holder("y") is None and holder("done") is None
        assert store.takeover("b", TTL, -60.0, 5, 10, flows=[]).taken == []

    def test_the_orphan_window_reads_only_headers_that_just_passed_the_grace_and_the_full_pass_all(self, store):
        """orphan_window: an orphan whose header passed orphan_after within the window is taken; one that
        passed it earlier is left to the full orphan pass (orphan_window None), which takes it. Expired
        leases are taken whatever their header's age."""
        from datetime import timedelta

        from django.utils import timezone

        now = timezone.now()
        for eid, age in (("recent", 90), ("old", 7200), ("expired", 7200)):
            running(eid)
            Execution.objects.filter(id=eid).update(updated_at=now - timedelta(seconds=age))
        store.acquire_many("a", [("expired", 1)], TTL)
        store.expire_many("a", [("expired", 1)])
        windowed = store.takeover("b", TTL, 60.0, 5, 10, orphan_window=300.0)
        assert windowed.taken == [("expired", 2), ("recent", 2)]
        assert store.takeover("b", TTL, 60.0, 5, 10, orphan_window=300.0).taken == []
        assert store.takeover("b", TTL, 60.0, 5, 10).taken == [("old", 2)]

    def test_takeover_takes_at_most_limit(self, store):
        for eid in ("x1", "x2", "x3"):
            running(eid)
        assert len(store.takeover("b", TTL, -60.0, 5, 2).taken) == 2
        assert len(store.takeover("b", TTL, -60.0, 5, 2).taken) == 1

    # -- workers --------------------------------------------------------------------------------
    def test_a_worker_registers_heartbeats_and_stops(self, store):
        store.touch_worker("w1", "host-a", 101, "worker")
        store.touch_worker("w1", "host-b", 102, "worker")
        worker = Worker.objects.get(id="w1")
        assert (worker.host, worker.pid, worker.role, worker.stopped_at) == ("host-b", 102, "worker", None)
        store.stop_worker("w1")
        assert Worker.objects.get(id="w1").stopped_at is not None
        store.touch_worker("w1", "host-b", 102)
        assert Worker.objects.get(id="w1").stopped_at is None

    def test_prune_deletes_workers_gone_quiet_that_hold_no_lease(self, store):
        running("x")
        for wid in ("idle", "holding"):
            store.touch_worker(wid, "h", 1)
        store.acquire_many("holding", [("x", 1)], TTL)
        assert store.prune_workers(LONG) == 0
        assert store.prune_workers(-60.0) == 1
        assert list(Worker.objects.values_list("id", flat=True)) == ["holding"]

    # -- start reservations -----------------------------------------------------------------------
    def test_a_start_reserves_its_id_once_and_a_repeat_reads_the_holder(self, store):
        assert store.reserve_start("r-1", "f.one", "h1", "ann") == (True, None)
        reserved, holder = store.reserve_start("r-1", "f.two", "h2", "bob")
        assert reserved is False and (holder.execution_id, holder.flow, holder.started_by) == ("r-1", "f.one", "ann")
        assert holder.matches("f.one", "h1", "ann") and not holder.matches("f.one", "h1", "bob")
        assert holder.created_at.tzinfo is not None  # an aware datetime on every backend, as the ORM reads it
        assert store.reservation("r-1") == holder and store.reservation("r-unknown") is None

    def test_release_deletes_only_that_reservation(self, store):
        for eid in ("r-a", "r-b"):
            store.reserve_start(eid, "f", "h", "")
        assert store.release_reservation("r-a") == 1 and store.release_reservation("r-a") == 0
        assert store.reservation("r-a") is None and store.reservation("r-b") is not None
        assert store.reserve_start("r-a", "f", "h", "") == (True, None)  # a released id is free again

    def test_prune_deletes_only_reservations_whose_execution_began(self, store):
        for eid in ("r-began", "r-queued"):
            store.reserve_start(eid, "conformance.flow", "h", "")
        running("r-began")
        assert store.prune_reservations() == 1
        assert store.reservation("r-began") is None and store.reservation("r-queued") is not None

    def test_reserved_ids_lists_the_reservations_oldest_first_up_to_the_limit(self, store):
        assert store.reserved_ids(10) == []
        for eid in ("r-3", "r-1", "r-2"):
            store.reserve_start(eid, "f", "h", "")
        listed = store.reserved_ids(10)
        assert sorted(listed) == ["r-1", "r-2", "r-3"] and len(store.reserved_ids(2)) == 2
        store.release_reservation(listed[0])
        assert listed[0] not in store.reserved_ids(10)

    def test_concurrent_starts_of_one_id_reserve_it_exactly_once(self, store):
        """Eight threads, each on its own connection and transaction, reserve one id: one wins, seven read it."""
        import threading

        from django.db import connections, transaction

        barrier, results, errors = threading.Barrier(8), [], []

        def reserve(n: int) -> None:
            try:
                barrier.wait()
                with transaction.atomic(using=store.alias):
                    results.append(store.reserve_start("r-race", "f", f"h{n}", ""))
            except Exception as exc:
                errors.append(exc)
            finally:
                connections.close_all()

        threads = [threading.Thread(target=reserve, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        winners = [r for r in results if r[0]]
        assert len(winners) == 1 and len(results) == 8
        holder = store.reservation("r-race")
        assert all(h == holder for won, h in results if not won)

    # -- benchmarks and tests -------------------------------------------------------------------
    def test_the_benchmarks_count_and_delete_only_the_leases_under_their_prefix(self, store):
        for eid in ("bench-1", "bench-2", "keep"):
            running(eid)
        store.acquire_many("a", [("bench-1", 1), ("bench-2", 1), ("keep", 1)], TTL)
        assert store.count_leases("bench-") == 2
        assert store.delete_leases("bench-") == 2
        assert store.count_leases("bench-") == 0 and holder("keep") == ("a", 1)
