"""The projection store contract: subscriptions, leased claims fenced by token, per-claim reads and acks."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction

from journal.envelopes import AppendItem, Envelope
from journal.store import store_for as journal_store_for
from projections.models import Subscription
from projections.store.base import CheckpointRow
from tests.conformance import StoreContract

LEASE = 30.0


def events(stream: str, n: int) -> None:
    """Append n events to a stream (seqs continue from its tip)."""
    journal_store_for().append_batch([AppendItem(stream, tuple(Envelope("Tick", {"i": i}) for i in range(n)))])


def sub(consumer: str, stream: str) -> Subscription:
    return Subscription.objects.get(consumer=consumer, stream=stream)


class ProjectionStoreContract(StoreContract):
    """What every projection backend does (projections.store.base.ProjectionStore)."""

    pytestmark = pytest.mark.django_db

    @staticmethod
    def app_store_for(alias: str = "default"):
        from projections.store import store_for

        return store_for(alias)

    covers = {
        "try_correlate_lock": "try_correlate_lock", "checkpoints": "checkpoints",
        "save_checkpoints": "save_checkpoints", "scan": "scan", "bump": "bump", "sync_consumer": "sync_consumer",
        "claim": "claim", "read": "read", "ack": "ack", "fail": "fail", "release": "release",
        "unblock": "unblock", "reset": "reset", "insert_caught_up": "insert_caught_up",
    }

    def subscribe(self, store, consumer: str, stream: str, tip: int, lane: str = "default", priority: int = 0):
        store.bump([(consumer, stream, "", lane, priority, tip)])

    # -- correlate ------------------------------------------------------------------------------
    def test_scan_returns_committed_events_after_an_id_in_id_order(self, store):
        events("a", 2)
        events("b", 1)
        scanned = store.scan(0, 10)
        assert [(e.stream_id, e.seq, e.type) for e in scanned] == [("a", 0, "Tick"), ("a", 1, "Tick"), ("b", 0, "Tick")]
        assert [e.id for e in store.scan(scanned[0].id, 1)] == [scanned[1].id]
        assert store.scan(scanned[-1].id, 10) == []

    def test_checkpoints_round_trip_and_come_with_the_database_clock(self, store):
        at = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
        with transaction.atomic():
            store.save_checkpoints([CheckpointRow("c1", 7, 9, at), CheckpointRow("c2", 1, 2, None)])
        rows, clock = store.checkpoints(["c1", "c2", "missing"])
        by = {r.consumer: r for r in rows}
        assert set(by) == {"c1", "c2"}
        assert (by["c1"].position, by["c1"].horizon_id, by["c1"].horizon_at) == (7, 9, at)
        assert by["c2"].horizon_at is None
        assert clock.now.tzinfo is not None and abs(clock.now - datetime.now(UTC)) < timedelta(hours=1)
        with transaction.atomic():
            store.save_checkpoints([CheckpointRow("c1", 8, 10, None)])
        assert store.checkpoints(["c1"])[0][0].position == 8
        assert store.checkpoints([])[0] == []

    def test_the_correlate_lock_is_granted_inside_a_transaction(self, store):
        with transaction.atomic():
            assert store.try_correlate_lock() is True

    def test_bump_subscribes_and_only_ever_raises_the_tip(self, store):
        assert store.bump([("c", "s", "src", "fast", 3, 4)]) == 1
        row = sub("c", "s")
        assert (row.source, row.lane, row.priority, row.at, row.tip) == ("src", "fast", 3, -1, 4)
        assert store.bump([("c", "s", "src", "fast", 3, 2)]) == 0
        assert store.bump([("c", "s", "src", "fast", 3, 6)]) == 1
        assert sub("c", "s").tip == 6 and store.bump([]) == 0

    def test_a_hinted_bump_is_clamped_to_the_streams_real_tip(self, store):
        events("real", 3)
        store.bump([("c", "real", "", "default", 0, 99), ("c", "ghost", "", "default", 0, 5)], hinted=True)
        assert sub("c", "real").tip == 2
        assert not Subscription.objects.filter(stream="ghost").exists()

    def test_sync_consumer_moves_existing_subscriptions_to_the_declared_lane(self, store):
        self.subscribe(store, "c", "s1", 1)
        self.subscribe(store, "other", "s1", 1)
        store.sync_consumer("c", "slow", 7)
        assert (sub("c", "s1").lane, sub("c", "s1").priority) == ("slow", 7)
        assert sub("other", "s1").lane == "default"

    # -- claim ----------------------------------------------------------------------------------
    def test_claim_leases_only_subscriptions_with_work_in_the_lane_for_the_consumers(self, store):
        events("s", 2)
        self.subscribe(store, "c", "s", 1)
        self.subscribe(store, "c", "caught-up", -1)
        self.subscribe(store, "c", "elsewhere", 1, lane="slow")
        self.subscribe(store, "other", "s", 1)
        claims = store.claim("default", ["c"], "w1", 10, LEASE)
        assert [(c.consumer, c.stream, c.at, c.tip, c.retries) for c in claims] == [("c", "s", -1, 1, 0)]
        assert claims[0].lease == sub("c", "s").lease == 1 and sub("c", "s").leased_by == "w1"
        assert store.claim("default", [], "w1", 10, LEASE) == []

    def test_a_live_lease_is_not_claimed_again_and_an_expired_one_is_with_a_new_token(self, store):
        self.subscribe(store, "c", "s", 1)
        first = store.claim("default", ["c"], "w1", 10, -1.0)  # expires at once
        second = store.claim("default", ["c"], "w2", 10, LEASE)
        assert [c.lease for c in first] == [1] and [c.lease for c in second] == [2]
        assert store.claim("default", ["c"], "w3", 10, LEASE) == []

    def test_claim_takes_higher_priority_first_up_to_the_limit(self, store):
        for stream, priority in (("low", 0), ("high", 5), ("mid", 1)):
            self.subscribe(store, f"c-{stream}", stream, 1, priority=priority)
        claims = store.claim("default", ["c-low", "c-high", "c-mid"], "w1", 2, LEASE)
        assert [c.stream for c in claims] == ["high", "mid"]

    @pytest.mark.django_db(transaction=True)
    def test_concurrent_claimers_never_get_the_same_subscription(self):
        """Real commits, two connections: the claims of racing workers are disjoint and cover all."""
        store = self.make_store()
        store.bump([("c", f"s{i:02d}", "", "default", 0, 1) for i in range(40)])
        got: dict[str, list[int]] = {"w1": [], "w2": []}
        errors: list[Exception] = []

        def worker(name: str) -> None:
            mine = self.make_store()
            try:
                while claims := mine.claim("default", ["c"], name, 3, LEASE):
                    got[name].extend(c.id for c in claims)
            except Exception as exc:  # reported below
                errors.append(exc)
            finally:
                connection.close()

        threads = [threading.Thread(target=worker, args=(name,)) for name in got]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert not set(got["w1"]) & set(got["w2"])
        assert len(got["w1"]) + len(got["w2"]) == 40

    # -- read -----------------------------------------------------------------------------------
    def test_each_claim_reads_from_its_own_watermark_up_to_the_batch(self, store):
        events("s", 5)
        self.subscribe(store, "ahead", "s", 4)
        self.subscribe(store, "behind", "s", 4)
        Subscription.objects.filter(consumer="ahead").update(at=2)
        claims = {c.consumer: c for c in store.claim("default", ["ahead", "behind"], "w", 10, LEASE)}
        read = store.read(list(claims.values()), 2)
        assert [e.seq for e in read[claims["ahead"].id]] == [3, 4]
        assert [e.seq for e in read[claims["behind"].id]] == [0, 1]
        assert read[claims["behind"].id][0].payload == {"i": 0} and read[claims["behind"].id][0].stream_id == "s"
        assert store.read([], 5) == {}

    # -- ack ------------------------------------------------------------------------------------
    def test_ack_moves_the_watermark_to_what_was_read_and_releases(self, store):
        events("s", 5)
        self.subscribe(store, "c", "s", 4)
        claim = store.claim("default", ["c"], "w", 10, LEASE)[0]
        assert store.ack([(claim, 2)], "w") == {claim.id}
        row = sub("c", "s")
        assert (row.at, row.tip, row.leased_by, row.leased_until) == (2, 4, None, None)
        again = store.claim("default", ["c"], "w", 10, LEASE)[0]
        assert again.at == 2 and again.lease == claim.lease + 1
        assert store.ack([], "w") == set()

    def test_an_ack_by_another_worker_or_with_an_old_token_changes_nothing(self, store):
        events("s", 3)
        self.subscribe(store, "c", "s", 2)
        old = store.claim("default", ["c"], "w1", 10, -1.0)[0]
        new = store.claim("default", ["c"], "w2", 10, LEASE)[0]
        assert store.ack([(old, 2)], "w1") == set()
        assert store.ack([(new, 2)], "w1") == set()
        assert sub("c", "s").at == -1
        assert store.ack([(new, 2)], "w2") == {new.id}

    def test_an_expired_lease_acks_nothing_even_if_nobody_took_it(self, store):
        events("s", 1)
        self.subscribe(store, "c", "s", 0)
        claim = store.claim("default", ["c"], "w", 10, -1.0)[0]
        assert store.ack([(claim, 0)], "w") == set()
        assert sub("c", "s").at == -1

    def test_a_tip_no_event_backs_comes_down_when_the_read_reached_the_end(self, store):
        events("s", 2)
        self.subscribe(store, "c", "s", 9)  # a forged tip: only seqs 0 and 1 exist
        claim = store.claim("default", ["c"], "w", 10, LEASE)[0]
        assert [e.seq for e in store.read([claim], 10)[claim.id]] == [0, 1]
        assert store.ack([(claim, 1)], "w", ended={claim.id}) == {claim.id}
        assert (sub("c", "s").at, sub("c", "s").tip) == (1, 1)
        assert store.claim("default", ["c"], "w", 10, LEASE) == []

    # -- fail / release / unblock / reset -------------------------------------------------------
    def test_fail_counts_keeps_progress_backs_off_and_blocks_at_the_limit(self, store):
        events("s", 3)
        self.subscribe(store, "c", "s", 2)
        claim = store.claim("default", ["c"], "w", 10, LEASE)[0]
        assert store.fail(claim, "w", "boom", 2, 3600.0, at=0) is False
        row = sub("c", "s")
        assert (row.at, row.retries, row.error, row.leased_by, row.blocked) == (0, 1, "boom", None, False)
        assert store.claim("default", ["c"], "w", 10, LEASE) == []  # backing off
        assert store.fail(claim, "w", "again", 2, 0.0) is None  # no longer holds the lease
        Subscription.objects.filter(id=claim.id).update(leased_until=None)
        claim = store.claim("default", ["c"], "w", 10, LEASE)[0]
        assert claim.retries == 1
        assert store.fail(claim, "w", "again", 2, -1.0) is True
        assert sub("c", "s").blocked and store.claim("default", ["c"], "w", 10, LEASE) == []

    def test_unblock_makes_a_blocked_subscription_claimable_again(self, store):
        events("s", 1)
        self.subscribe(store, "c", "s", 0)
        claim = store.claim("default", ["c"], "w", 10, LEASE)[0]
        store.fail(claim, "w", "boom", 1, 3600.0)
        assert store.unblock([claim.id]) == 1
        row = sub("c", "s")
        assert (row.blocked, row.retries, row.error) == (False, 0, "")
        assert [c.id for c in store.claim("default", ["c"], "w", 10, LEASE)] == [claim.id]
        assert store.unblock([]) == 0

    def test_release_gives_the_lease_back_without_progress(self, store):
        events("s", 1)
        self.subscribe(store, "c", "s", 0)
        claim = store.claim("default", ["c"], "w1", 10, LEASE)[0]
        store.release([claim], "w2")  # not w2's: untouched
        assert store.claim("default", ["c"], "w2", 10, LEASE) == []
        store.release([claim], "w1")
        again = store.claim("default", ["c"], "w2", 10, LEASE)
        assert [(c.id, c.at) for c in again] == [(claim.id, -1)]
        store.release([], "w1")

    def test_reset_replays_from_the_start_and_voids_leases_in_flight(self, store):
        events("s", 3)
        self.subscribe(store, "c", "s", 2)
        self.subscribe(store, "other", "s", 2)
        claim = store.claim("default", ["c"], "w", 10, LEASE)[0]
        store.ack([(claim, 2)], "w")
        self.subscribe(store, "c", "s", 3)
        in_flight = store.claim("default", ["c"], "w", 10, LEASE)[0]
        assert store.reset("c") == 1
        assert store.ack([(in_flight, 3)], "w") == set()
        assert sub("c", "s").at == -1 and sub("other", "s").at == -1
        assert [c.at for c in store.claim("default", ["c"], "w", 10, LEASE)] == [-1]

    # -- benchmarks and tests -------------------------------------------------------------------
    def test_insert_caught_up_writes_rows_as_given_and_only_those_behind_are_claimed(self, store):
        events("behind", 3)
        store.insert_caught_up([("c", "done", "default", 0, 4, 4), ("c", "behind", "default", 2, 0, 2)])
        assert (sub("c", "done").at, sub("c", "done").tip, sub("c", "done").lease) == (4, 4, 0)
        claims = store.claim("default", ["c"], "w", 10, LEASE)
        assert [(c.stream, c.at, c.tip) for c in claims] == [("behind", 0, 2)]
        assert [e.seq for e in store.read(claims, 10)[claims[0].id]] == [1, 2]
