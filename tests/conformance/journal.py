"""The journal store contract: fenced, guarded, all-or-nothing appends with contiguous seqs."""

from __future__ import annotations

import contextlib
import threading
from datetime import datetime, timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from journal.envelopes import AppendItem, Envelope, SnapshotRecord
from journal.exceptions import (
    BatchRefused,
    InvalidPayload,
    SequenceConflict,
    StaleFence,
    StreamExists,
    UnknownStream,
)
from journal.models import Execution
from journal.store.base import ExecutionBoot, ExecutionSettle, WaitRecord
from tests.conformance import StoreContract


def item(stream_id: str, *types: str, fence_token: int | None = None, expected_seq: int | None = None) -> AppendItem:
    return AppendItem(stream_id, tuple(Envelope(t, {"t": t}) for t in types), fence_token, expected_seq)


class AppendsContract(StoreContract):
    """The log itself (journal.store.base.JournalStore): opens, guarded appends, fences, reads, snapshots."""

    pytestmark = pytest.mark.django_db

    @staticmethod
    def app_store_for(alias: str = "default"):
        from journal.store import store_for

        return store_for(alias)

    covers = {
        "_append": "append_batch", "_open": "open_stream", "advance_fence": "advance_fence",
        "save_snapshot": "save_snapshot", "lock_stream": "lock_stream", "append_batch": "append_batch",
        "append_encoded": "append_encoded", "open_stream": "open_stream", "read": "read", "tip": "tip",
        "current_fence": "current_fence", "latest_snapshot": "latest_snapshot",
    }

    def types(self, store, stream_id: str) -> list[tuple[int, str]]:
        return [(e.seq, e.type) for e in store.read(stream_id)]

    # -- open -----------------------------------------------------------------------------------
    def test_open_writes_seq_zero_with_fence_token_one(self, store):
        token, appended = store.open_stream(item("x", "Started", "More"))
        assert (token, appended.stream_id, appended.first_seq, appended.last_seq) == (1, "x", 0, 1)
        assert store.current_fence("x") == 1 and store.tip("x") == 1
        assert self.types(store, "x") == [(0, "Started"), (1, "More")]

    def test_a_second_open_is_refused_and_writes_nothing(self, store):
        store.open_stream(item("x", "Started"))
        with pytest.raises(StreamExists):
            store.open_stream(item("x", "Again", "Twice"))
        assert self.types(store, "x") == [(0, "Started")] and store.current_fence("x") == 1

    def test_open_refuses_a_stream_that_has_events_but_no_fence(self, store):
        store.append_batch([item("agg", "Created", expected_seq=-1)])
        with pytest.raises(StreamExists):
            store.open_stream(item("agg", "Started"))
        assert store.current_fence("agg") is None and self.types(store, "agg") == [(0, "Created")]

    # -- appends --------------------------------------------------------------------------------
    def test_appends_get_contiguous_seqs_from_zero_and_say_which(self, store):
        first = store.append_batch([item("a", "One", "Two")])
        second = store.append_batch([item("a", "Three")])
        assert [(r.first_seq, r.last_seq) for r in first + second] == [(0, 1), (2, 2)]
        assert self.types(store, "a") == [(0, "One"), (1, "Two"), (2, "Three")] and store.tip("a") == 2

    def test_append_encoded_writes_what_encode_validated(self, store):
        items = [item("a", "One"), item("b", "Two", "Three")]
        appended = store.append_encoded(items, store.encode(items))
        assert [(r.stream_id, r.first_seq, r.last_seq) for r in appended] == [("a", 0, 0), ("b", 0, 1)]

    def test_an_empty_batch_writes_nothing(self, store):
        assert store.append_batch([]) == []

    def test_expected_tip_is_a_guard(self, store):
        store.append_batch([item("a", "One", expected_seq=-1)])
        with pytest.raises(SequenceConflict, match="expected tip -1, found 0"):
            store.append_batch([item("a", "Again", expected_seq=-1)])
        store.append_batch([item("a", "Two", expected_seq=0)])
        assert self.types(store, "a") == [(0, "One"), (1, "Two")]

    def test_the_current_fence_token_is_accepted_and_a_stale_one_refused(self, store):
        store.open_stream(item("x", "Started"))
        store.append_batch([item("x", "Step", fence_token=1)])
        assert store.advance_fence("x") == 2
        with pytest.raises(StaleFence):
            store.append_batch([item("x", "Late", fence_token=1)])
        store.append_batch([item("x", "NewOwner", fence_token=2)])
        assert [t for _, t in self.types(store, "x")] == ["Started", "Step", "NewOwner"]

    def test_both_guards_must_pass(self, store):
        store.open_stream(item("x", "Started"))
        with pytest.raises(SequenceConflict):
            store.append_batch([item("x", "Wrong", fence_token=1, expected_seq=5)])
        with pytest.raises(StaleFence):
            store.append_batch([item("x", "Wrong", fence_token=9, expected_seq=0)])
        store.append_batch([item("x", "Right", fence_token=1, expected_seq=0)])
        assert store.tip("x") == 1

    def test_a_token_for_a_stream_without_fence_or_events_is_unknown(self, store):
        with pytest.raises(UnknownStream):
            store.append_batch([item("nowhere", "E", fence_token=1)])
        store.append_batch([item("plain", "E")])
        with pytest.raises(UnknownStream):
            store.append_batch([item("plain", "E", fence_token=1)])
        assert store.tip("nowhere") == -1 and store.tip("plain") == 0

    def test_a_batch_is_all_or_nothing_and_names_each_refused_stream(self, store):
        store.open_stream(item("f", "Started"))
        store.advance_fence("f")
        store.append_batch([item("s", "One")])
        with pytest.raises(BatchRefused) as refused:
            store.append_batch([item("ok", "E"), item("f", "E", fence_token=1), item("s", "E", expected_seq=-1)])
        assert isinstance(refused.value.errors["f"], StaleFence)
        assert isinstance(refused.value.errors["s"], SequenceConflict)
        assert "ok" not in refused.value.errors
        assert store.tip("ok") == -1 and store.tip("f") == 0 and store.tip("s") == 0

    def test_a_batch_appends_each_stream_from_its_own_tip(self, store):
        store.append_batch([item("a", "A0", "A1")])
        store.open_stream(item("b", "B0"))
        appended = store.append_batch([item("c", "C0"), item("a", "A2"), item("b", "B1", fence_token=1)])
        assert [(r.stream_id, r.first_seq) for r in appended] == [("c", 0), ("a", 2), ("b", 1)]

    def test_a_stream_twice_in_one_batch_is_invalid(self, store):
        with pytest.raises(InvalidPayload, match="twice"):
            store.append_batch([item("a", "One"), item("a", "Two")])
        assert store.tip("a") == -1

    def test_an_oversized_payload_is_refused_before_any_sql(self, store, settings):
        settings.LOOM_MAX_PAYLOAD_BYTES = 64
        with pytest.raises(InvalidPayload):
            store.append_batch([item("a", "Ok"), AppendItem("b", (Envelope("Big", {"x": "y" * 200}),))])
        assert store.tip("a") == -1 and store.tip("b") == -1

    def test_a_refusal_inside_a_transaction_leaves_it_usable(self, store):
        store.append_batch([item("a", "One")])
        with transaction.atomic():
            store.append_batch([item("b", "InTxn")])
            with pytest.raises(SequenceConflict):
                store.append_batch([item("a", "Conflict", expected_seq=-1)])
            with pytest.raises(UnknownStream):
                store.advance_fence("nowhere")
            store.append_batch([item("c", "StillWorks")])
        assert (store.tip("a"), store.tip("b"), store.tip("c")) == (0, 0, 0)

    # -- fences ---------------------------------------------------------------------------------
    def test_advance_fence_bumps_by_one_or_compares_and_sets(self, store):
        store.open_stream(item("x", "Started"))
        assert store.advance_fence("x") == 2
        assert store.advance_fence("x", expected_token=2) == 3
        with pytest.raises(StaleFence):
            store.advance_fence("x", expected_token=2)
        assert store.current_fence("x") == 3

    def test_advance_fence_of_an_unknown_stream_is_refused(self, store):
        store.append_batch([item("plain", "E")])
        for stream_id in ("nowhere", "plain"):
            with pytest.raises(UnknownStream):
                store.advance_fence(stream_id)
            assert store.current_fence(stream_id) is None

    def test_lock_stream_holds_inside_a_transaction_and_appends_still_go_through(self, store):
        with transaction.atomic():
            store.lock_stream("a")
            store.append_batch([item("a", "Locked", expected_seq=-1)])
        assert store.tip("a") == 0

    # -- reads ----------------------------------------------------------------------------------
    def test_read_returns_payloads_in_seq_order_after_a_seq_and_up_to_a_limit(self, store):
        payload = {"text": "naïve ☃", "nested": {"list": [1, 2.5, None, True]}, "n": 2**40}
        store.append_batch([AppendItem("a", (Envelope("P", payload), Envelope("Q"), Envelope("R")))])
        events = store.read("a")
        assert [e.seq for e in events] == [0, 1, 2] and events[0].payload == payload
        assert events[0].id < events[1].id < events[2].id
        assert all(isinstance(e.recorded_at, datetime) and e.recorded_at.tzinfo is not None for e in events)
        assert [e.type for e in store.read("a", after_seq=0)] == ["Q", "R"]
        assert [e.type for e in store.read("a", after_seq=0, limit=1)] == ["Q"]
        assert store.read("nowhere") == []

    def test_an_unknown_stream_has_tip_minus_one_and_no_fence(self, store):
        assert store.tip("nowhere") == -1 and store.current_fence("nowhere") is None

    # -- snapshots ------------------------------------------------------------------------------
    def test_the_latest_snapshot_is_the_highest_seq_and_the_first_write_of_a_seq_stays(self, store):
        store.save_snapshot(SnapshotRecord("a", 3, {"n": 3}))
        store.save_snapshot(SnapshotRecord("a", 7, {"n": 7, "deep": {"list": ["x"]}}))
        store.save_snapshot(SnapshotRecord("a", 7, {"n": "ignored duplicate"}))
        latest = store.latest_snapshot("a")
        assert (latest.stream_id, latest.seq, latest.state) == ("a", 7, {"n": 7, "deep": {"list": ["x"]}})
        assert store.latest_snapshot("b") is None

    # -- concurrency ----------------------------------------------------------------------------
    @pytest.mark.django_db(transaction=True)
    def test_concurrent_writers_leave_contiguous_seqs_and_only_named_refusals(self):
        """Unguarded writers racing on one stream: every refusal is a SequenceConflict (never a raw
        database error) and what was written is exactly seqs 0..n-1 with no duplicate."""
        written, errors = [], []

        def writer(n: int) -> None:
            store = self.make_store()
            try:
                for i in range(10):
                    with contextlib.suppress(SequenceConflict):  # a lost race: the one named refusal
                        written.extend(store.append_batch([item("hot", f"W{n}-{i}")]))
            except Exception as exc:  # anything else breaks the contract: reported below
                errors.append(exc)
            finally:
                connection.close()

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        store = self.make_store()
        seqs = [e.seq for e in store.read("hot")]
        assert seqs == list(range(len(written))) and sorted(r.first_seq for r in written) == seqs


def execution(store, eid: str, *types: str) -> None:
    """A running execution as the flows leave it: its stream opened (fence 1) and its header row."""
    store.open_stream(item(eid, *types))
    Execution.objects.create(id=eid, flow="conformance.flow")


def boot(eid: str, *types: str, flow: str = "conformance.flow", status: str = "running", result: str | None = None,
         finished: bool = False) -> ExecutionBoot:
    """A fresh execution's bootstrap as journal/flows/writer.py builds it (validated, encoded)."""
    first = item(eid, *types)
    return ExecutionBoot(first, [env.encode() for env in first.envelopes], flow, status, '{"x": 1}', result, "",
                         finished)


def settle(eid: str, token: int, tip: int, *types: str, status: str = "completed",
           result: str | None = '"done"', error: str = "") -> ExecutionSettle:
    last = item(eid, *types, fence_token=token, expected_seq=tip)
    return ExecutionSettle(last, [env.encode() for env in last.envelopes], status, result, error)


class ExecutionsContract:
    """The flows' writes on the journal (journal.store.base.JournalStore, executions section): a run's
    first events with its header, its settling events with its terminal state; mixed into
    JournalStoreContract."""

    covers = {
        "_bootstrap": "bootstrap_execution", "_bootstrap_many": "bootstrap_many", "_settle": "settle_many",
        "bootstrap_execution": "bootstrap_execution", "bootstrap_many": "bootstrap_many",
        "settle_execution": "settle_execution", "settle_many": "settle_many",
        "execution_status": "execution_status",
    }

    def test_a_bootstrap_writes_seq_zero_fence_one_and_the_header_together(self, store):
        assert store.bootstrap_execution(boot("e", "EXECUTION_STARTED", "STEP")) == 1
        assert store.current_fence("e") == 1 and store.tip("e") == 1
        assert store.execution_status("e") == ("running", "conformance.flow", None, "")
        assert Execution.objects.get(id="e").input == {"x": 1}
        assert store.execution_status("nowhere") is None

    def test_a_second_bootstrap_is_refused_and_writes_nothing(self, store):
        store.bootstrap_execution(boot("e", "EXECUTION_STARTED"))
        with pytest.raises(StreamExists):
            store.bootstrap_execution(boot("e", "EXECUTION_STARTED", "Again", flow="other"))
        assert store.tip("e") == 0 and store.execution_status("e")[1] == "conformance.flow"

    def test_a_bootstrap_of_an_aggregate_stream_is_refused_and_writes_nothing(self, store):
        store.append_batch([item("agg", "Created")])
        with pytest.raises(StreamExists):
            store.bootstrap_execution(boot("agg", "EXECUTION_STARTED"))
        assert store.current_fence("agg") is None and store.execution_status("agg") is None

    def test_bootstrap_many_starts_the_new_and_refuses_only_the_existing(self, store):
        store.bootstrap_execution(boot("old", "EXECUTION_STARTED"))
        outcome = store.bootstrap_many([boot("n1", "S"), boot("old", "S", "T"), boot("n2", "S")])
        assert outcome[0] == 1 and outcome[2] == 1 and isinstance(outcome[1], StreamExists)
        assert (store.tip("n1"), store.tip("old"), store.tip("n2")) == (0, 0, 0)
        assert store.execution_status("n2")[0] == "running"

    def test_a_finished_bootstrap_records_its_outcome(self, store):
        store.bootstrap_execution(boot("e", "EXECUTION_STARTED", "EXECUTION_COMPLETED", status="completed",
                                       result='{"ok": true}', finished=True))
        assert store.execution_status("e") == ("completed", "conformance.flow", {"ok": True}, "")
        assert Execution.objects.get(id="e").finished_at is not None

    def test_a_settle_appends_at_the_tip_under_the_fence_and_ends_the_header(self, store):
        store.bootstrap_execution(boot("e", "EXECUTION_STARTED"))
        appended = store.settle_execution(settle("e", 1, 0, "EXECUTION_COMPLETED"))
        assert (appended.first_seq, appended.last_seq) == (1, 1)
        assert store.execution_status("e") == ("completed", "conformance.flow", "done", "")

    def test_a_settle_after_a_takeover_is_refused_and_changes_nothing(self, store):
        store.bootstrap_execution(boot("e", "EXECUTION_STARTED"))
        store.advance_fence("e")
        with pytest.raises(StaleFence):
            store.settle_execution(settle("e", 1, 0, "EXECUTION_FAILED", status="failed", error="boom"))
        with pytest.raises(SequenceConflict):
            store.settle_execution(settle("e", 2, 5, "EXECUTION_COMPLETED"))
        assert store.tip("e") == 0 and store.execution_status("e")[0] == "running"

    def test_settle_many_is_all_or_nothing_and_names_the_refused(self, store):
        for eid in ("a", "b"):
            store.bootstrap_execution(boot(eid, "EXECUTION_STARTED"))
        store.advance_fence("b")
        with pytest.raises(BatchRefused) as refused:
            store.settle_many([settle("a", 1, 0, "EXECUTION_COMPLETED"), settle("b", 1, 0, "EXECUTION_COMPLETED")])
        assert set(refused.value.errors) == {"b"}
        assert store.tip("a") == 0 and store.execution_status("a")[0] == "running"
        store.settle_many([settle("a", 1, 0, "EXECUTION_COMPLETED"), settle("b", 2, 0, "EXECUTION_COMPLETED")])
        assert store.execution_status("a")[0] == store.execution_status("b")[0] == "completed"


class ForOtherAppsContract:
    """The journal's statements other apps' stores call (fences, recovery counts, event reads) and the
    benchmarks' counts and clean-up; mixed into JournalStoreContract."""

    covers = {
        "_advance_fences": "advance_fences", "advance_fences": "advance_fences", "read_after": "read_after",
        "mark_recovered": "mark_recovered", "mark_stuck": "mark_stuck", "scan_events": "scan_events",
        "last_event_id": "last_event_id", "count_events": "count_events",
        "count_gapped_streams": "count_gapped_streams", "events_per_stream": "events_per_stream",
        "count_executions": "count_executions", "delete_streams": "delete_streams",
        "delete_executions": "delete_executions",
    }

    def test_advance_fences_bumps_every_fenced_stream_and_skips_the_others(self, store):
        for eid in ("b", "a"):
            store.open_stream(item(eid, "Started"))
        store.append_batch([item("plain", "E")])
        with transaction.atomic():
            assert store.advance_fences(["b", "a", "plain", "nowhere"]) == [("a", 2), ("b", 2)]
        assert store.advance_fences([]) == []
        with pytest.raises(StaleFence):
            store.append_batch([item("a", "Late", fence_token=1)])

    def test_recoveries_are_counted_and_a_given_up_execution_is_stuck(self, store):
        for eid in ("a", "b"):
            execution(store, eid, "EXECUTION_STARTED")
        assert store.mark_recovered(["a", "b", "nowhere"]) == 2
        assert store.mark_recovered(["a"]) == 1
        assert store.mark_stuck(["a"]) == 1
        a = Execution.objects.get(id="a")
        assert (a.status, a.recoveries) == ("stuck", 2) and "2 attempts" in a.error
        assert Execution.objects.get(id="b").status == "running"
        assert store.mark_recovered([]) == store.mark_stuck([]) == 0

    def test_scan_events_pages_the_global_order_and_last_event_id_is_its_end(self, store):
        assert store.last_event_id() == 0 or store.scan_events(store.last_event_id(), 10) == []
        before = store.last_event_id()
        store.append_batch([item("a", "A0", "A1")])
        store.append_batch([item("b", "B0")])
        scanned = store.scan_events(before, 10)
        assert [tuple(r[1:]) for r in scanned] == [("a", 0, "A0"), ("a", 1, "A1"), ("b", 0, "B0")]
        assert store.last_event_id() == scanned[-1][0]
        assert [r[0] for r in store.scan_events(scanned[0][0], 1)] == [scanned[1][0]]

    def test_read_after_reads_each_pair_from_its_own_seq(self, store):
        store.append_batch([item("a", "A0", "A1", "A2", "A3")])
        store.append_batch([item("b", "B0")])
        found = store.read_after([("a", -1), ("a", 1), ("b", 0), ("a", 1)], 2)
        assert [e.seq for e in found[("a", -1)]] == [0, 1]
        assert [e.seq for e in found[("a", 1)]] == [2, 3]
        assert found[("b", 0)] == [] and found[("a", 1)][0].payload == {"t": "A2"}
        assert store.read_after([], 5) == {}

    def test_the_benchmarks_counts_and_clean_up_see_only_their_prefix(self, store):
        execution(store, "bench-1", "S", "T")
        execution(store, "bench-2", "S")
        store.append_batch([item("keep", "E")])
        assert store.count_events("bench-") == 3 and store.count_gapped_streams("bench-") == 0
        assert tuple(store.events_per_stream("bench-")) == (2, 1, 2)
        assert store.count_executions("bench-", "running") == 2
        store.delete_streams(prefix="bench-")
        store.delete_executions(ids=["bench-1"])
        assert store.count_events("bench-") == 0 and store.current_fence("bench-1") is None
        assert store.count_executions("bench-", "running") == 1 and store.tip("keep") == 0

    def test_deleting_executions_deletes_their_waits_messages_and_events(self, store):
        for eid in ("bench-w", "keep-w"):
            parked(store, eid, due=timezone.now())
            store.send_message(eid, "go", "m", "1", timezone.now())
            store.put_flow_event(eid, "k", "2")
        store.delete_executions(prefix="bench-")
        assert store.wait_of("bench-w") is None and store.messages_of("bench-w", 5) == []
        assert store.flow_event("bench-w", "k")[0] is False
        assert store.wait_of("keep-w") is not None and len(store.messages_of("keep-w", 5)) == 1
        assert store.flow_event("keep-w", "k") == (True, 2)

class PrivacyContract:
    """The personal-data section (journal_datakey, journal_contentlink: journal/privacy); mixed into
    JournalStoreContract. A data key row is created once (a second writer keeps the first key), forgetting
    overwrites it to a tombstone that no later create replaces, and rotation is a compare-and-set."""

    covers = {
        "data_keys": "data_keys", "create_data_keys": "create_data_keys", "forget_subject": "forget_subject",
        "data_keys_to_rotate": "data_keys_to_rotate", "rewrap_data_key": "rewrap_data_key",
        "master_key_ids": "master_key_ids", "link_content": "link_content", "reveal": "reveal",
        "delete_privacy_rows": "delete_privacy_rows",
    }

    def test_a_data_key_is_created_once_and_a_forgotten_subject_stays_forgotten(self, store):
        assert store.data_keys(["s1", "s2"]) == {}
        store.create_data_keys([("s1", "m1", "w1"), ("s2", "m1", "w2")])
        store.create_data_keys([("s1", "m2", "other")])  # a racing writer: the first key stays
        assert store.data_keys(["s1", "s2", "s3"]) == {"s1": ("m1", "w1"), "s2": ("m1", "w2")}
        assert store.forget_subject("s1", "ops") == []
        assert store.forget_subject("s9", "ops") == []  # never had a key: a tombstone all the same
        store.create_data_keys([("s1", "m1", "again"), ("s9", "m1", "new")])
        assert store.data_keys(["s1", "s9"]) == {"s1": ("", None), "s9": ("", None)}
        assert store.master_key_ids() == {"m1": ("w2", "s2")}

    def test_rotation_rewraps_only_keys_still_as_they_were_read(self, store):
        store.create_data_keys([("a", "old", "wa"), ("b", "old", "wb"), ("c", "new", "wc")])
        assert store.data_keys_to_rotate("new", 10) == [("a", "old", "wa"), ("b", "old", "wb")]
        assert store.rewrap_data_key("a", "wa", "new", "wa2") == 1
        store.forget_subject("b", "ops")
        assert store.rewrap_data_key("b", "wb", "new", "wb2") == 0  # forgotten meanwhile: the forget wins
        assert store.data_keys_to_rotate("new", 10) == []
        assert store.data_keys(["a", "b"]) == {"a": ("new", "wa2"), "b": ("", None)}

    def test_forget_unlinks_the_subjects_content_and_names_what_no_one_else_links(self, store):
        store.link_content([("h1", "s1"), ("h2", "s1"), ("h2", "s2"), ("h3", ""), ("h1", "s1")])
        assert store.forget_subject("s1", "ops") == ["h1"]  # h2 is still linked by s2
        assert store.forget_subject("s1", "ops") == []

    def test_the_benchmarks_clean_up_removes_only_their_subjects_and_content(self, store):
        store.create_data_keys([("bench:1:a", "m", "w"), ("keep", "m", "w")])
        store.link_content([("h1", "bench:1:a"), ("h2", ""), ("h3", "")])
        store.delete_privacy_rows("bench:1:", ["h2"])
        assert store.data_keys(["bench:1:a", "keep"]) == {"keep": ("m", "w")}
        assert store.forget_subject("x", "ops") == [] and store.master_key_ids() == {"m": ("w", "keep")}
        store.link_content([("h3", "y")])
        assert store.forget_subject("y", "ops") == []  # h3 is still linked by '' (not deleted)

    def test_reveal_leaves_plain_events_as_they_are(self, store):
        store.append_batch([item("plain", "A", "B")])
        events = store.read("plain")
        assert store.reveal(events) == events and store.reveal([]) == []



def parked(store, eid: str, *, due=None, kind: str = "sleep", topic: str = "", child: str = "",
           flow: str = "conformance.flow") -> None:
    """An execution as a run leaves it when it parks: its stream, header and wait row (fence 1)."""
    store.bootstrap_execution(boot(eid, "EXECUTION_STARTED", flow=flow))
    assert store.park(WaitRecord(eid, flow, kind, 0, 1, due, topic, child), "waiting") is not False


class WaitsContract:
    """Flows that wait (journal.store.base.JournalStore, waits section): wait rows parked under a fence
    and claimed once, messages kept until consumed once, flow events; mixed into JournalStoreContract."""

    covers = {
        "lock_execution": "lock_execution", "park": "park", "claim_due_waits": "claim_due_waits",
        "next_wait_due": "next_wait_due", "wake_wait": "wake_wait", "drop_wait": "drop_wait",
        "wait_of": "wait_of", "set_execution_status": "set_execution_status", "send_message": "send_message",
        "pending_message": "pending_message", "consume_message": "consume_message", "messages_of": "messages_of",
        "put_flow_event": "put_flow_event", "flow_event": "flow_event", "carry_messages": "carry_messages",
        "explain_due_waits": "explain_due_waits",
    }

    def test_park_writes_the_wait_and_the_status_under_the_fence_only(self, store):
        due = timezone.now() + timedelta(hours=1)
        parked(store, "w", due=due)
        wait = store.wait_of("w")
        assert (wait["kind"], wait["token"], wait["due_at"]) == ("sleep", 1, due)
        assert store.execution_status("w")[0] == "waiting" and store.lock_execution("w") == "waiting"
        assert store.lock_execution("nobody") is None
        store.advance_fence("w")
        assert store.park(WaitRecord("w", "conformance.flow", "sleep", 3, 1, None), "waiting") is False
        assert store.wait_of("w")["pos"] == 0  # the stale park wrote nothing
        assert store.set_execution_status("w", 1, "running") is False
        assert store.set_execution_status("w", 2, "running") is True and store.execution_status("w")[0] == "running"

    def test_claim_takes_due_waits_in_due_order_advances_fences_and_skips_stale_rows(self, store):
        now = timezone.now()
        parked(store, "late", due=now - timedelta(seconds=1))
        parked(store, "early", due=now - timedelta(seconds=5))
        parked(store, "future", due=now + timedelta(hours=1))
        parked(store, "stale", due=now - timedelta(seconds=3))
        store.advance_fence("stale")  # taken over since it parked: its row wakes nothing
        assert store.next_wait_due() == now - timedelta(seconds=5)
        claimed = store.claim_due_waits(now, 10, None)
        assert [(c.execution_id, c.token, c.kind) for c in claimed] == [("early", 2, "sleep"), ("late", 2, "sleep")]
        assert store.wait_of("stale") is None and store.wait_of("early") is None
        assert store.execution_status("early")[0] == "running" and store.current_fence("early") == 2
        assert store.claim_due_waits(now, 10, None) == [] and store.next_wait_due() == now + timedelta(hours=1)

    def test_claim_takes_at_most_its_limit_and_only_the_flows_asked_for(self, store):
        past = timezone.now() - timedelta(seconds=1)
        for i in range(3):
            parked(store, f"a{i}", due=past)
        parked(store, "other", due=past, flow="other.flow")
        assert len(store.claim_due_waits(timezone.now(), 2, ["conformance.flow"])) == 2
        assert [c.execution_id for c in store.claim_due_waits(timezone.now(), 5, ["conformance.flow"])] == ["a2"]
        assert store.wait_of("other") is not None

    def test_claim_and_next_due_of_some_flows_never_see_other_flows_due_waits(self, store):
        now = timezone.now()
        parked(store, "other", due=now - timedelta(seconds=9), flow="other.flow")
        parked(store, "mine", due=now + timedelta(hours=1))
        parked(store, "soon", due=now - timedelta(seconds=1), flow="second.flow")
        assert store.next_wait_due(["conformance.flow"]) == now + timedelta(hours=1)
        assert store.next_wait_due(["conformance.flow", "second.flow"]) == now - timedelta(seconds=1)
        assert store.next_wait_due() == now - timedelta(seconds=9) and store.next_wait_due(["none"]) is None
        assert store.claim_due_waits(now, 5, ["conformance.flow"]) == []
        assert [c.execution_id for c in store.claim_due_waits(now, 5, ["conformance.flow", "second.flow"])] == [
            "soon"]
        assert store.wait_of("other") is not None

    def test_explain_due_waits_names_the_flow_due_index_and_claims_nothing(self, store):
        parked(store, "x", due=timezone.now())
        found = store.explain_due_waits(["conformance.flow"])
        assert "journal_wait_flow_due" in found["plan"] and "journal_wait_flow_due" in found["next_due_plan"]
        assert store.wait_of("x") is not None  # explained, not run

    def test_carry_messages_moves_the_unconsumed_ones_to_the_next_run_and_wakes_its_recv(self, store):
        store.bootstrap_execution(boot("old", "EXECUTION_STARTED"))
        for mid in ("m1", "m2", "m3"):
            store.send_message("old", "go", mid, f'"{mid}"', timezone.now())
        row_id, _, _ = store.pending_message("old", "go")
        store.consume_message(row_id, 4, timezone.now())  # m1 consumed by the old run: it stays
        parked(store, "new", kind="recv", topic="go")
        store.send_message("new", "go", "m3", '"again"', timezone.now())  # already there by its id
        assert store.carry_messages("old", "new", timezone.now()) == 1
        assert [(m["message_id"], m["payload"]) for m in store.messages_of("new", 10)] == [
            ("m3", "again"), ("m2", "m2")]
        assert store.pending_message("new", "go")[1] == "m2"  # the carried one first (its id is older)
        assert [m["message_id"] for m in store.messages_of("old", 10)] == ["m3", "m1"]
        assert store.wait_of("new")["due_at"] is not None
        assert store.carry_messages("old", "new", timezone.now()) == 0

    def test_carry_messages_copies_the_flow_events_the_next_run_has_not_set(self, store):
        store.put_flow_event("old2", "progress", "1")
        store.put_flow_event("old2", "stage", '"a"')
        store.put_flow_event("new2", "stage", '"b"')
        store.carry_messages("old2", "new2", timezone.now())
        assert store.flow_event("new2", "progress") == (True, 1) and store.flow_event("new2", "stage") == (True, "b")

    def test_a_message_is_kept_once_per_id_wakes_its_topic_and_is_consumed_once(self, store):
        parked(store, "r", kind="recv", topic="go")
        assert store.send_message("r", "other", "m0", '{"n": 0}', timezone.now()) == ("waiting", True)
        assert store.wait_of("r")["due_at"] is None  # another topic wakes nothing
        assert store.send_message("r", "go", "m1", '{"n": 1}', timezone.now()) == ("waiting", True)
        assert store.send_message("r", "go", "m1", '{"n": 2}', timezone.now()) == ("waiting", False)
        assert store.wait_of("r")["due_at"] is not None
        row_id, message_id, payload = store.pending_message("r", "go")
        assert (message_id, payload) == ("m1", {"n": 1})
        assert store.consume_message(row_id, 5, timezone.now()) is True
        assert store.consume_message(row_id, 6, timezone.now()) is False
        assert store.pending_message("r", "go") is None
        assert [(m["message_id"], m["consumed_at"] is not None) for m in store.messages_of("r", 10)] == [
            ("m1", True), ("m0", False)]
        assert store.send_message("nobody", "go", "m", "1", timezone.now()) == (None, False)

    def test_a_settled_execution_takes_no_message(self, store):
        store.bootstrap_execution(boot("done", "EXECUTION_STARTED", "EXECUTION_COMPLETED", status="completed",
                                       finished=True))
        assert store.send_message("done", "go", "m", "1", timezone.now()) == ("completed", False)
        assert store.messages_of("done", 10) == []

    def test_a_park_sees_a_pending_message_or_a_settled_child(self, store):
        store.bootstrap_execution(boot("r", "EXECUTION_STARTED"))
        store.send_message("r", "go", "m1", "1", timezone.now())
        assert store.park(WaitRecord("r", "conformance.flow", "recv", 0, 1, None, "go"), "waiting") is not None
        store.bootstrap_execution(boot("kid", "EXECUTION_STARTED", "EXECUTION_COMPLETED", status="completed",
                                       finished=True))
        store.bootstrap_execution(boot("p", "EXECUTION_STARTED"))
        assert store.park(WaitRecord("p", "conformance.flow", "child", 0, 1, None, "", "kid"), "waiting") is not None
        assert store.wait_of("p")["due_at"] is not None

    def test_wake_makes_a_wait_due_now_and_drop_deletes_it(self, store):
        parked(store, "c", kind="child", child="kid")
        assert store.wake_wait("c", timezone.now(), child="someone-else") is False
        assert store.wake_wait("c", timezone.now(), child="kid") is True
        assert store.wake_wait("c", timezone.now() + timedelta(seconds=1)) is False  # due already
        store.drop_wait("c")
        assert store.wait_of("c") is None and store.wake_wait("c", timezone.now()) is False

    def test_flow_events_are_set_overwritten_and_read(self, store):
        assert store.flow_event("e", "k") == (False, None)
        store.put_flow_event("e", "k", '{"a": 1}')
        store.put_flow_event("e", "k", '"two"')
        store.put_flow_event("e", "null", "null")
        assert store.flow_event("e", "k") == (True, "two") and store.flow_event("e", "null") == (True, None)

    @pytest.mark.parametrize("flows", [None, ["conformance.flow", "second.flow"]])
    @pytest.mark.django_db(transaction=True)
    def test_claimers_racing_for_due_waits_wake_each_once(self, flows):
        """Four threads, each with its own connection, claim the same due rows (of any flow, or per flow
        as a worker does): every wait is claimed by exactly one of them and its fence advanced once."""
        store = self.make_store()
        past = timezone.now() - timedelta(seconds=1)
        ids = [f"race{i:02d}" for i in range(24)]
        for i, eid in enumerate(ids):
            parked(store, eid, due=past, flow="second.flow" if i % 3 == 0 else "conformance.flow")
        connection.close()
        claims, errors = [], []
        barrier = threading.Barrier(4)

        def claimer() -> None:
            mine = self.make_store()
            try:
                barrier.wait()
                while True:
                    got = mine.claim_due_waits(timezone.now(), 3, flows)
                    if not got:
                        break
                    claims.extend(c.execution_id for c in got)
            except Exception as exc:
                errors.append(exc)
            finally:
                connection.close()

        threads = [threading.Thread(target=claimer) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert sorted(claims) == ids
        assert {store.current_fence(eid) for eid in ids} == {2}


class JournalStoreContract(AppendsContract, ExecutionsContract, ForOtherAppsContract, WaitsContract,
                           PrivacyContract):
    """What every journal backend does (journal.store.base.JournalStore): the five parts above."""

    covers = {**AppendsContract.covers, **ExecutionsContract.covers, **ForOtherAppsContract.covers,
              **WaitsContract.covers, **PrivacyContract.covers}
