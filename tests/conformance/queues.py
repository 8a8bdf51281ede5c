"""The queue store contract: entries inserted once per dedup id and execution id, a dequeue that
keeps every cap of the queue's row and frees a slot when the execution's header settles, and that takes
only entries of the flow versions asked for (the header's flow_version; by name without a header)."""

from __future__ import annotations

import pytest

from journal.models import Execution
from queues.declarations import QueueSpec
from queues.models import Queue, QueueEntry
from queues.store.base import NewEntry
from tests.conformance import StoreContract

LONG = 3600.0
FLOWS = ["conformance.flow"]


def entry(queue: str, eid: str, n: int = 0, **options) -> NewEntry:
    return NewEntry(queue, eid, "conformance.flow", f'{{"n": {n}}}', "", **options)


class QueueStoreContract(StoreContract):
    """What every queue backend does (queues.store.base.QueueStore). Real commits: the dequeue and
    the enqueue run their own transactions, as in a worker."""

    pytestmark = pytest.mark.django_db(transaction=True)

    @staticmethod
    def app_store_for(alias: str = "default"):
        from queues.store import store_for

        return store_for(alias)

    covers = {
        "has_queue": "has_queue", "upsert_queue": "upsert_queue", "insert_entry": "insert_entry",
        "ready_queues": "ready_queues", "dequeue": "dequeue", "queue_stats": "queue_stats",
        "cancel_pending": "cancel_pending", "reopen": "reopen", "begin": "begin", "count_entries": "count_entries",
        "delete_entries": "delete_entries",
        "delete_queue": "delete_queue", "running_by_partition": "running_by_partition",
        "prune_entries": "prune_entries", "next_due": "next_due", "upsert_resume": "upsert_resume",
    }

    @pytest.fixture
    def queue(self, store):
        store.upsert_queue(QueueSpec("cq", 2, partition_concurrency=1))
        return "cq"

    def test_upsert_writes_and_replaces_the_caps(self, store):
        assert not store.has_queue("cq2")
        store.upsert_queue(QueueSpec("cq2", 3))
        store.upsert_queue(QueueSpec("cq2", 5, rate_limit=2, rate_period=1.5))
        row = Queue.objects.get(pk="cq2")
        assert store.has_queue("cq2") and (row.concurrency, row.rate_limit, row.rate_period) == (5, 2, 1.5)

    def test_an_insert_creates_a_missing_queue_row_from_its_caps(self, store):
        assert store.insert_entry(entry("fresh", "f-1", caps=(4, None, None, None))) is None
        assert Queue.objects.get(pk="fresh").concurrency == 4

    def test_next_due_is_the_time_to_the_earliest_deferred_entry_of_the_flows_asked_for(self, store, queue):
        from datetime import UTC, datetime, timedelta

        assert store.next_due(FLOWS) is None
        store.insert_entry(entry(queue, "nd-now", 1))  # due now: not deferred
        assert store.next_due(FLOWS) is None
        soon, later = datetime.now(UTC) + timedelta(seconds=60), datetime.now(UTC) + timedelta(hours=2)
        store.insert_entry(entry(queue, "nd-soon", 2, run_after=soon))
        store.insert_entry(entry(queue, "nd-later", 3, run_after=later))
        assert 50 < store.next_due(FLOWS) <= 61
        assert store.next_due(["some.other.flow"]) is None

    def test_only_the_flow_versions_asked_for_are_ready_claimed_or_due_and_a_headerless_entry_by_name(self, store):
        """The flows filter takes names (any version) and (name, version) pairs (registry.runnable()): an entry
        matches by its header's flow_version; one without a header (written before queued headers) by name."""
        from datetime import UTC, datetime, timedelta

        store.upsert_queue(QueueSpec("vq", 5))
        for eid, version in (("v-1", 1), ("v-2", 2), ("v-old", None)):
            store.insert_entry(entry("vq", eid))
            if version is not None:
                Execution.objects.create(id=eid, flow="conformance.flow", status="queued", flow_version=version)
        v1, v2 = [("conformance.flow", 1)], [("conformance.flow", 2)]
        assert store.ready_queues(v2, LONG) == ["vq"] and store.ready_queues([("other", 2)], LONG) == []
        assert [c.execution_id for c in store.dequeue("vq", "w2", 10, v2, LONG)] == ["v-2", "v-old"]
        assert store.ready_queues([*v2, ("conformance.flow", 3)], LONG) == []  # v-1 left, unclaimed
        assert QueueEntry.objects.get(execution_id="v-1").attempts == 0
        assert store.ready_queues(FLOWS, LONG) == store.ready_queues(v1, LONG) == ["vq"]
        assert [c.execution_id for c in store.dequeue("vq", "w1", 10, v1 + v2, LONG)] == ["v-1"]
        later = datetime.now(UTC) + timedelta(seconds=60)
        for eid, version, due in (("d-1", 1, later), ("d-2", 2, later + timedelta(hours=2))):
            store.insert_entry(entry("vq", eid, run_after=due))
            Execution.objects.create(id=eid, flow="conformance.flow", status="queued", flow_version=version)
        assert 50 < store.next_due(v1) <= 61 and 50 < store.next_due(FLOWS) <= 61
        assert 7150 < store.next_due(v2) <= 7261 and store.next_due([("conformance.flow", 3)]) is None

    def test_a_dedup_id_or_an_execution_id_is_inserted_once(self, store, queue):
        assert store.insert_entry(entry(queue, "a-1", 1, dedup_id="d")) is None
        found = store.insert_entry(entry(queue, "a-2", 2, dedup_id="d"))
        assert (found.execution_id, found.by_dedup, found.input) == ("a-1", True, {"n": 1})
        again = store.insert_entry(entry(queue, "a-1", 3))
        assert (again.execution_id, again.by_dedup) == ("a-1", False)
        assert QueueEntry.objects.count() == 1

    def test_the_dequeue_keeps_the_global_and_partition_caps(self, store, queue):
        for n, key in enumerate(["k", "k", "j", "i"]):
            store.insert_entry(entry(queue, f"c-{n}", n, partition_key=key))
        assert store.ready_queues(FLOWS, LONG) == [queue] and store.ready_queues(["other"], LONG) == []
        claimed = store.dequeue(queue, "w", 10, FLOWS, LONG)
        assert [c.execution_id for c in claimed] == ["c-0", "c-2"] and claimed[0].input == {"n": 0}
        assert store.dequeue(queue, "w", 10, FLOWS, LONG) == []
        stats = {s.name: s for s in store.queue_stats()}[queue]
        assert (stats.concurrency, stats.pending, stats.ready, stats.running) == (2, 2, 2, 2)

    def test_a_settled_header_frees_the_slot_and_a_running_one_keeps_it(self, store, queue):
        for n in range(3):
            store.insert_entry(entry(queue, f"s-{n}", n))
        first = store.dequeue(queue, "w", 10, FLOWS, LONG)
        Execution.objects.create(id=first[0].execution_id, flow="conformance.flow", status="completed")
        Execution.objects.create(id=first[1].execution_id, flow="conformance.flow", status="running")
        assert [c.execution_id for c in store.dequeue(queue, "w", 10, FLOWS, 0.0)] == ["s-2"]
        assert QueueEntry.objects.get(execution_id="s-0").state == "done"
        assert store.running_by_partition(queue) == {None: 1}

    def test_a_claim_that_never_began_is_offered_again(self, store, queue):
        store.insert_entry(entry(queue, "r-1"))
        store.dequeue(queue, "dead", 10, FLOWS, LONG)
        (again,) = store.dequeue(queue, "alive", 10, FLOWS, 0.0)
        assert (again.execution_id, again.attempts) == ("r-1", 2)

    def test_a_reoffered_entry_whose_late_start_began_is_counted_again(self, store):
        store.upsert_queue(QueueSpec("one", 1))
        store.insert_entry(entry("one", "l-1"))
        store.insert_entry(entry("one", "l-2"))
        store.dequeue("one", "slow", 1, FLOWS, LONG)
        assert store.dequeue("one", "w", 1, FLOWS, 0.0)[0].execution_id == "l-1"  # offered again, claimed again
        QueueEntry.objects.filter(execution_id="l-1").update(state="pending")  # as if offered again once more
        Execution.objects.create(id="l-1", flow="conformance.flow", status="running")  # the slow one began
        assert store.dequeue("one", "w", 1, FLOWS, 0.0) == []  # adopted: l-1 holds the only slot
        assert QueueEntry.objects.get(execution_id="l-1").state == "started"

    def test_the_rate_limit_bounds_starts_per_window(self, store):
        store.upsert_queue(QueueSpec("rq", 10, rate_limit=2, rate_period=LONG))
        for n in range(4):
            store.insert_entry(entry("rq", f"rq-{n}", n))
        assert len(store.dequeue("rq", "w", 10, FLOWS, LONG)) == 2
        assert store.dequeue("rq", "w", 10, FLOWS, LONG) == []

    def test_pruning_deletes_finished_entries_outside_the_rate_window(self, store, queue):
        store.upsert_queue(QueueSpec("windowed", 5, rate_limit=5, rate_period=LONG))
        store.insert_entry(entry(queue, "p-1"))
        store.insert_entry(entry(queue, "p-2"))
        store.insert_entry(entry("windowed", "p-3"))
        store.insert_entry(entry(queue, "p-4"))
        store.dequeue(queue, "w", 1, FLOWS, LONG)
        store.dequeue("windowed", "w", 1, FLOWS, LONG)
        Execution.objects.create(id="p-1", flow="conformance.flow", status="completed")
        Execution.objects.create(id="p-3", flow="conformance.flow", status="completed")
        store.dequeue(queue, "w", 0 + 1, FLOWS, LONG)  # settles p-1 (and claims p-2)
        store.dequeue("windowed", "w", 1, FLOWS, LONG)  # settles p-3
        store.cancel_pending("p-4")
        assert store.prune_entries(LONG) == 0  # all finished just now
        assert store.prune_entries(0.0) == 2  # p-1 and p-4; p-3 is inside its queue's rate window
        assert sorted(QueueEntry.objects.values_list("execution_id", flat=True)) == ["p-2", "p-3"]

    def test_cancel_pending_cancels_until_the_run_begins_and_begin_refuses_a_cancelled_one(self, store, queue):
        for eid in ("x-1", "x-2", "x-3"):
            store.insert_entry(entry(queue, eid))
        x1, _ = store.dequeue(queue, "w", 2, FLOWS, LONG)
        assert x1.worker == "w" and x1.attempts == 1
        assert not store.begin("x-1", "other", 1) and not store.begin("x-1", "w", 2)  # not this claim
        assert store.begin("x-1", "w", 1) and not store.begin("x-1", "w", 1)  # once
        assert not store.cancel_pending("x-1")  # begun
        assert store.cancel_pending("x-2") and not store.begin("x-2", "w", 1)  # claimed, not begun
        assert store.cancel_pending("x-3") and not store.cancel_pending("none")  # pending; unknown
        assert QueueEntry.objects.get(execution_id="x-2").state == "cancelled"

    def test_upsert_resume_reopens_the_executions_entry_as_a_resume_never_over_a_pending_start(self, store, queue):
        """A hand-over: the execution's one entry pending again as a resume from the fence (in its own
        queue), or a new entry; refused over a pending start; claimed, it carries its fence and force."""
        store.insert_entry(entry(queue, "h-1"))
        assert not store.upsert_resume(NewEntry("cq", "h-1", "conformance.flow", "", "", resume_fence=3))
        (claimed,) = store.dequeue(queue, "w", 1, FLOWS, LONG)
        assert claimed.resume_fence is None and store.begin("h-1", "w", 1)
        Execution.objects.create(id="h-1", flow="conformance.flow", status="running")
        assert store.upsert_resume(NewEntry("other-queue", "h-1", "conformance.flow", "", "", resume_fence=3,
                                            resume_force=True))
        row = QueueEntry.objects.get(execution_id="h-1")
        assert (row.queue_id, row.state, row.resume_fence, row.resume_force, row.begun_at) == (
            queue, "pending", 3, True, None)  # its own queue, not the one named
        (again,) = store.dequeue(queue, "w", 1, FLOWS, LONG)
        assert (again.execution_id, again.resume_fence, again.resume_force, again.attempts) == ("h-1", 3, True, 2)
        assert store.upsert_resume(NewEntry(queue, "h-2", "conformance.flow", "", "", resume_fence=1,
                                            caps=(2, None, None, None)))
        assert QueueEntry.objects.get(execution_id="h-2").resume_fence == 1

    def test_reopen_counts_a_settled_entry_again_within_the_cap(self, store, queue):
        from queues.exceptions import QueueFull

        for eid in ("r-1", "r-2", "r-3"):
            store.insert_entry(entry(queue, eid))
        store.dequeue(queue, "w", 2, FLOWS, LONG)  # r-1, r-2 claimed: the queue (cap 2) is full
        Execution.objects.create(id="r-1", flow="conformance.flow", status="failed")
        Execution.objects.create(id="r-2", flow="conformance.flow", status="running")
        assert [c.execution_id for c in store.dequeue(queue, "w", 5, FLOWS, LONG)] == ["r-3"]  # r-1 done
        with pytest.raises(QueueFull):
            store.reopen("r-1")  # r-2 and r-3 hold both slots
        assert QueueEntry.objects.get(execution_id="r-1").state == "done"
        Execution.objects.create(id="r-3", flow="conformance.flow", status="completed")
        Execution.objects.filter(pk="r-1").update(status="running")  # retried
        assert store.reopen("r-1") and not store.reopen("r-1") and not store.reopen("none")
        assert QueueEntry.objects.get(execution_id="r-1").state == "started"
        assert store.dequeue(queue, "w", 5, FLOWS, LONG) == []  # r-1 and r-2 run: full

    def test_bench_counts_and_clean_up_see_only_their_prefix(self, store, queue):
        store.insert_entry(entry(queue, "bench-1"))
        store.insert_entry(entry(queue, "other-1"))
        assert store.count_entries("bench-", "pending") == 1
        assert store.delete_entries("bench-") == 1 and QueueEntry.objects.count() == 1
        store.delete_queue(queue)
        assert not store.has_queue(queue) and QueueEntry.objects.count() == 0
