"""The journal's behavioural suite: the same cases pass on SQLite and on PostgreSQL."""

from __future__ import annotations

import pytest
from django.db import connection

from journal.envelopes import AppendItem, Envelope
from journal.exceptions import (
    BatchRefused,
    InvalidPayload,
    InvalidStream,
    SequenceConflict,
    StaleFence,
    StreamExists,
    UnknownStream,
)
from journal.models import Event, Fence, Snapshot

pytestmark = pytest.mark.django_db


def rows() -> list[tuple[str, int, str]]:
    return list(Event.objects.order_by("stream_id", "seq").values_list("stream_id", "seq", "type"))


def test_seqs_are_contiguous_from_zero():
    Event.objects.append("a", [Envelope("One"), Envelope("Two")])
    Event.objects.append("a", Envelope("Three"), expected_seq=1)
    Event.objects.append("a", [("Four", {"n": 4})])
    assert [seq for _, seq, _ in rows()] == [0, 1, 2, 3]
    assert Event.objects.tip("a") == 3
    assert [e.type for e in Event.objects.read("a", after_seq=1)] == ["Three", "Four"]
    assert Event.objects.read("a")[3].payload == {"n": 4}


def test_open_stream_writes_seq_zero_and_fence_one():
    token, appended = Event.objects.open_stream("x", [Envelope("Started", {"input": 1})])
    assert (token, appended.first_seq, appended.last_seq) == (1, 0, 0)
    assert Fence.objects.current("x") == 1


def test_second_open_is_refused_and_writes_nothing():
    Event.objects.open_stream("x", [Envelope("Started")])
    with pytest.raises(StreamExists, match="already exists"):
        Event.objects.open_stream("x", [Envelope("Started"), Envelope("More")])
    assert rows() == [("x", 0, "Started")]


def test_open_refuses_an_existing_unfenced_stream():
    Event.objects.append("agg", Envelope("Created"), expected_seq=-1)
    with pytest.raises(StreamExists):
        Event.objects.open_stream("agg", Envelope("Started"))
    assert Fence.objects.current("agg") is None
    assert rows() == [("agg", 0, "Created")]


def test_stale_fence_is_refused_after_takeover():
    Event.objects.open_stream("x", Envelope("Started"))
    Event.objects.append("x", Envelope("Step"), fence_token=1)
    assert Fence.objects.advance("x") == 2
    with pytest.raises(StaleFence, match="token 1 is not the current 2"):
        Event.objects.append("x", Envelope("Late"), fence_token=1)
    Event.objects.append("x", Envelope("NewOwner"), fence_token=2)
    assert [t for _, _, t in rows()] == ["Started", "Step", "NewOwner"]


def test_advance_with_expected_token_is_compare_and_set():
    Event.objects.open_stream("x", Envelope("Started"))
    assert Fence.objects.advance("x", expected_token=1) == 2
    with pytest.raises(StaleFence):
        Fence.objects.advance("x", expected_token=1)
    with pytest.raises(UnknownStream):
        Fence.objects.advance("nope")


def test_expected_seq_guard():
    Event.objects.append("a", Envelope("One"), expected_seq=-1)
    with pytest.raises(SequenceConflict, match="expected tip -1, found 0"):
        Event.objects.append("a", Envelope("Again"), expected_seq=-1)
    with pytest.raises(SequenceConflict, match="expected tip 5, found 0"):
        Event.objects.append("a", Envelope("Ahead"), expected_seq=5)
    assert rows() == [("a", 0, "One")]


def test_both_guards_together():
    Event.objects.open_stream("x", Envelope("Started"))
    Event.objects.append("x", Envelope("Ok"), fence_token=1, expected_seq=0)
    with pytest.raises(SequenceConflict):
        Event.objects.append("x", Envelope("Behind"), fence_token=1, expected_seq=0)
    with pytest.raises(StaleFence):
        Event.objects.append("x", Envelope("WrongToken"), fence_token=7, expected_seq=1)
    assert Event.objects.tip("x") == 1


def test_unknown_stream():
    with pytest.raises(UnknownStream, match="does not exist"):
        Event.objects.append("ghost", Envelope("E"), fence_token=1)
    with pytest.raises(UnknownStream):
        Event.objects.append("ghost", Envelope("E"), expected_seq=3)
    assert rows() == []


def test_unfenced_stream_with_token_is_unknown_as_single_writer():
    Event.objects.append("agg", Envelope("Created"))
    with pytest.raises(UnknownStream, match="no fence"):
        Event.objects.append("agg", Envelope("E"), fence_token=1)


def test_batch_appends_many_streams():
    Event.objects.open_stream("x", Envelope("Started"))
    Event.objects.append("b", Envelope("One"))
    result = Event.objects.append_batch([
        AppendItem.build("x", [Envelope("S1"), Envelope("S2")], fence_token=1),
        AppendItem.build("b", Envelope("Two"), expected_seq=0),
        ("c", [Envelope("First")], None, -1),
    ])
    assert [(r.stream_id, r.first_seq, r.last_seq) for r in result] == [("x", 1, 2), ("b", 1, 1), ("c", 0, 0)]
    assert rows() == [("b", 0, "One"), ("b", 1, "Two"), ("c", 0, "First"),
                      ("x", 0, "Started"), ("x", 1, "S1"), ("x", 2, "S2")]


def test_batch_with_one_stale_fence_writes_nothing_and_names_it():
    Event.objects.open_stream("x", Envelope("Started"))
    Event.objects.open_stream("y", Envelope("Started"))
    Fence.objects.advance("y")
    before = rows()
    with pytest.raises(BatchRefused) as info:
        Event.objects.append_batch([
            AppendItem.build("x", Envelope("Fine"), fence_token=1),
            AppendItem.build("y", Envelope("Stale"), fence_token=1),
            AppendItem.build("z", Envelope("New"), expected_seq=-1),
        ])
    assert set(info.value.errors) == {"y"}
    assert isinstance(info.value.errors["y"], StaleFence)
    assert "y" in str(info.value)
    assert rows() == before


def test_batch_with_taken_sequence_writes_nothing():
    Event.objects.append("a", Envelope("One"))
    with pytest.raises(BatchRefused) as info:
        Event.objects.append_batch([
            AppendItem.build("b", Envelope("Fine"), expected_seq=-1),
            AppendItem.build("a", Envelope("Late"), expected_seq=-1),
        ])
    assert isinstance(info.value.errors["a"], SequenceConflict)
    assert rows() == [("a", 0, "One")]


def test_batch_rejects_a_stream_twice():
    with pytest.raises(InvalidPayload, match="appears twice"):
        Event.objects.append_batch([("a", [Envelope("One")]), ("a", [Envelope("Two")])])


@pytest.mark.parametrize(
    ("envelope", "message"),
    [
        (Envelope("has space"), "invalid event type"),
        (Envelope(""), "invalid event type"),
        (Envelope("9starts-with-digit"), "invalid event type"),
        (Envelope("T" * 101), "invalid event type"),
        (Envelope("Bad", {"x": object()}), "not JSON-serialisable"),
        (Envelope("Bad", {"x": float("nan")}), "not JSON-serialisable"),
        (Envelope("Big", {"x": "y" * 2048}), "over LOOM_MAX_PAYLOAD_BYTES=1024"),
        (Envelope("Nul", {"x": "a\x00b"}), "NUL"),
    ],
)
def test_bad_payloads_are_refused_and_nothing_is_written(settings, envelope, message):
    settings.LOOM_MAX_PAYLOAD_BYTES = 1024
    Event.objects.append("a", Envelope("Good"))
    with pytest.raises(InvalidPayload, match=message):
        Event.objects.append("a", [Envelope("Fine"), envelope])
    with pytest.raises(InvalidPayload):
        Event.objects.append_batch([("b", [Envelope("Fine")]), ("a", [envelope])])
    assert rows() == [("a", 0, "Good")]


@pytest.mark.parametrize("stream_id", ["", "has space", "tab\there", "x" * 201, None, 7])
def test_bad_stream_ids(stream_id):
    with pytest.raises(InvalidStream):
        Event.objects.append(stream_id, Envelope("E"))
    assert rows() == []


@pytest.mark.parametrize(
    "kwargs", [{"fence_token": 0}, {"fence_token": "1"}, {"expected_seq": -2}, {"expected_seq": 1.5}]
)
def test_bad_guards(kwargs):
    with pytest.raises(InvalidPayload):
        Event.objects.append("a", Envelope("E"), **kwargs)


def test_empty_append_is_an_error():
    with pytest.raises(InvalidPayload, match="no events"):
        Event.objects.append("a", [])


def test_events_cannot_be_saved_or_deleted_through_the_orm():
    Event.objects.append("a", Envelope("E"))
    event = Event.objects.get()
    with pytest.raises(TypeError, match="append-only"):
        event.save()
    with pytest.raises(TypeError, match="append-only"):
        event.delete()


def test_refused_append_inside_a_transaction_leaves_it_usable():
    from django.db import transaction

    Event.objects.append("a", Envelope("One"))
    with transaction.atomic():
        Event.objects.append("b", Envelope("InTxn"))
        with pytest.raises(SequenceConflict):
            Event.objects.append("a", Envelope("Conflict"), expected_seq=-1)
        Event.objects.append("c", Envelope("StillWorks"))
    assert rows() == [("a", 0, "One"), ("b", 0, "InTxn"), ("c", 0, "StillWorks")]


def test_snapshots_keep_the_newest():
    Snapshot.objects.save_state("a", 3, {"n": 3})
    Snapshot.objects.save_state("a", 7, {"n": 7})
    Snapshot.objects.save_state("a", 7, {"n": "ignored duplicate"})
    latest = Snapshot.objects.latest("a")
    assert (latest.seq, latest.state) == (7, {"n": 7})
    assert Snapshot.objects.latest("b") is None


def test_backend_is_the_configured_one():
    assert connection.vendor in {"sqlite", "postgresql"}
