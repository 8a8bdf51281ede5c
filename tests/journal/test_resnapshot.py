"""`loom aggregates resnapshot` (journal/aggregates/resnapshot.py; docs/aggregates.md, "Re-snapshot after a code
change"): a snapshot an older code took that no longer fits is re-taken from seq 0 by the current code, claiming
exactly the seq it folded (in place of one there); one that fits is kept (`--all` re-takes it too); a dry run
writes nothing; a compacted stream whose snapshot no longer fits is refused with what to do; a sensitive state is
skipped and said so; its free-text options are checked (hypothesis); an appender racing it loses nothing and folds
nothing twice (PostgreSQL, real commits in threads)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as hs

from journal import compaction
from journal.aggregates import State, cache, do, load, replay
from journal.aggregates import resnapshot as redo
from journal.aggregates.runtime import fold_events
from journal.envelopes import Envelope
from journal.models import Event, Snapshot
from journal.store.retention import RetentionStore
from tests.fixtures import privacy_fixtures as fx
from tests.journal import aggregate_states
from tests.journal.aggregate_states import Tally

pytestmark = pytest.mark.django_db


tally, bump = aggregate_states.tally("ResnapTally", snapshot_every=5)
# its streams start with tally's prefix too
other, other_bump = aggregate_states.tally("ResnapTally-Other", snapshot_every=5)


@pytest.fixture(autouse=True)
def _setup(settings):
    settings.LOOM_COMPACT_AGGREGATES = []
    cache.clear()
    yield
    cache.clear()


def rows(table: str) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT stream_id, seq, {'state' if table == 'journal_snapshot' else 'payload'} FROM {table} "
                       "ORDER BY stream_id, seq")
        return [(sid, seq, json.loads(v) if isinstance(v, str) else v) for sid, seq, v in cursor.fetchall()]


def bumps(action, id: str, times: int) -> None:
    for _ in range(times):
        do(action, id, {"by": 1})


def old_code_snapshot(stream: str, **state) -> None:
    """The newest snapshot as the old code took it (its shape: `n` only, unless given)."""
    newest = Snapshot.objects.filter(stream_id=stream).order_by("-seq").first()
    Snapshot.objects.filter(pk=newest.pk).update(state=state or {"n": newest.state["n"]})


def snapshots(stream: str) -> list[tuple[int, dict]]:
    return list(Snapshot.objects.filter(stream_id=stream).order_by("seq").values_list("seq", "state"))


def loom(*args: str) -> tuple[int, dict, str]:
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("loom", "aggregates", "resnapshot", "--json", *args, stdout=out, stderr=err)
        code = 0
    except CommandError as exc:
        code = exc.returncode
    return code, json.loads(out.getvalue() or "{}"), err.getvalue()


def truth(st: State, stream: str, seq: int) -> dict:
    """The current code's fold of the stream's events 0..seq."""
    events = [e for e in Event.objects.read(stream) if e.seq <= seq]
    return fold_events(st, stream, events).model_dump(mode="json")


def reading(id: str, reads: list[tuple[int, int, int]]) -> Callable[[], None]:
    """A cold replay of aggregate `id` of tally, appending (n, bumps, version) to `reads`."""
    def read() -> None:
        agg = replay(tally, id)
        reads.append((agg.state.n, agg.state.bumps, agg.version))

    return read


def test_a_snapshot_that_no_longer_fits_is_retaken_from_seq_0_and_one_that_fits_is_kept():
    """a: 12 events, its newest snapshot (seq 9) in the old shape -> a new one at seq 11 (the last event folded).
    d: 10 events, the old snapshot at seq 9 = its tip -> replaced in place (the runtime's save keeps an existing
    row). b fits: untouched; c has no snapshot; a stream of the state with the longer prefix is its own."""
    bumps(bump, "a", 12)
    bumps(bump, "b", 6)
    bumps(bump, "c", 3)
    bumps(bump, "d", 10)
    bumps(other_bump, "o", 6)
    old_code_snapshot("ResnapTally-a")
    old_code_snapshot("ResnapTally-d")
    old_code_snapshot("ResnapTally-Other-o")  # not tally's: only a run over its own state re-takes it
    events_before = rows("journal_event")
    b_before, o_before = snapshots("ResnapTally-b"), snapshots("ResnapTally-Other-o")
    cache.clear()
    assert replay(tally, "a").state == Tally(n=12, bumps=12)  # the loader replays from seq 0 meanwhile

    code, doc, progress = loom("--state", "ResnapTally")

    assert code == 0, doc
    assert (doc["checked"], doc["resnapshotted"], doc["fits"]) == (3, 2, 1)
    assert {(s["stream"], s["action"], s["seq"]) for s in doc["streams"]} == {
        ("ResnapTally-a", "resnapshotted", 11), ("ResnapTally-d", "resnapshotted", 9)}
    assert snapshots("ResnapTally-a")[-1] == (11, {"n": 12, "bumps": 12})
    assert snapshots("ResnapTally-d") == [(4, {"n": 5, "bumps": 5}), (9, {"n": 10, "bumps": 10})]
    assert snapshots("ResnapTally-b") == b_before and snapshots("ResnapTally-Other-o") == o_before
    assert not snapshots("ResnapTally-c")
    assert rows("journal_event") == events_before  # events are never written by it
    assert "default: ResnapTally: 3 stream(s) checked, 2 re-snapshotted" in progress
    cache.clear()
    assert load(tally, "a").state == Tally(n=12, bumps=12) and load(tally, "d").version == 9

    code, doc, _ = loom("--state", "ResnapTally-Other")
    assert code == 0 and [s["stream"] for s in doc["streams"]] == ["ResnapTally-Other-o"]
    assert loom()[1]["resnapshotted"] == 0  # every snapshot fits now: a second run writes nothing


def test_a_dry_run_folds_and_reports_and_writes_nothing():
    bumps(bump, "dry", 7)
    old_code_snapshot("ResnapTally-dry")
    before = rows("journal_snapshot")
    code, doc, progress = loom("--dry-run")
    assert code == 0
    assert [(s["stream"], s["action"], s["seq"]) for s in doc["streams"]] == [
        ("ResnapTally-dry", "would resnapshot", 6)]
    assert "no longer fits" in doc["streams"][0]["reason"] and "would be re-snapshotted" in progress
    assert rows("journal_snapshot") == before


def test_all_retakes_a_snapshot_that_fits_but_was_folded_by_an_older_fold():
    bumps(bump, "fold", 6)
    old_code_snapshot("ResnapTally-fold", n=999, bumps=0)  # fits the schema, wrong by the current fold
    assert loom()[1]["resnapshotted"] == 0
    code, doc, _ = loom("--all", "--stream", "ResnapTally-fold")
    assert code == 0 and doc["resnapshotted"] == 1
    assert snapshots("ResnapTally-fold")[-1] == (5, {"n": 6, "bumps": 6})


def test_a_compacted_stream_whose_snapshot_no_longer_fits_is_refused_with_what_to_do_and_the_others_are_done(settings):
    settings.LOOM_COMPACT_AGGREGATES = ["ResnapTally"]
    bumps(bump, "cmp", 12)
    bumps(bump, "kept", 12)
    compaction.run("default")
    assert [e.seq for e in Event.objects.read("ResnapTally-cmp")] == [9, 10, 11]
    bumps(bump, "fresh", 7)  # after the compaction run: not compacted
    old_code_snapshot("ResnapTally-cmp")
    old_code_snapshot("ResnapTally-fresh")
    cmp_before = snapshots("ResnapTally-cmp"), [e.seq for e in Event.objects.read("ResnapTally-cmp")]

    code, doc, _ = loom()

    assert code == 1 and doc["ok"] is False and doc["type"] == "CompactedStream"
    assert "ResnapTally-cmp" in doc["error"] and "cannot refold it" in doc["error"]
    assert "model_validator" in doc["error"]  # what to do
    found = {s["stream"]: s["action"] for s in doc["results"]["streams"]}
    assert found == {"ResnapTally-cmp": "refused", "ResnapTally-fresh": "resnapshotted"}
    assert (snapshots("ResnapTally-cmp"), [e.seq for e in Event.objects.read("ResnapTally-cmp")]) == cmp_before
    assert snapshots("ResnapTally-fresh")[-1] == (6, {"n": 7, "bumps": 7})

    code, doc, _ = loom("--all", "--stream", "ResnapTally-kept")  # compacted, its snapshot fits: kept, said why
    assert code == 0 and doc["streams"][0]["action"] == "skipped"
    assert "cannot be refolded from seq 0" in doc["streams"][0]["reason"]


def test_a_sensitive_state_is_skipped_and_said_so_and_never_snapshotted(settings):
    settings.LOOM_KEYS = [fx.KEY_A]
    from journal.privacy import keys

    keys.cache.clear()
    do(fx.add_contact, "rs1", {"email": "ann@example.com"}, actor="u-9")
    before = rows("journal_snapshot")
    code, doc, _ = loom("--all", "--state", fx.contacts.name)
    assert code == 0 and doc["checked"] == 0 and "sensitive" in doc["skipped_states"][fx.contacts.name]
    code, doc, _ = loom("--all")
    assert code == 0 and "sensitive" in doc["skipped_states"][fx.contacts.name]
    code, doc, _ = loom("--stream", fx.contacts.stream("rs1"))
    assert code == 0 and fx.contacts.name in doc["skipped_states"]
    assert rows("journal_snapshot") == before
    out = io.StringIO()
    call_command("loom", "aggregates", "resnapshot", "--state", fx.contacts.name, stdout=out)
    assert f"{fx.contacts.name}: skipped, sensitive" in out.getvalue()


def test_an_old_code_snapshot_written_above_ours_meanwhile_is_refolded(monkeypatch):
    """Between our write and its check, a process on the old code appends and snapshots (its shape) at the new
    tip: the stream is folded again and re-snapshotted at that tip."""
    bumps(bump, "late", 6)
    old_code_snapshot("ResnapTally-late")
    original = RetentionStore.resnapshot
    calls = []

    def then_old_code(self, stream_id, seq, state, at):
        original(self, stream_id, seq, state, at)
        if not calls:
            tip = Event.objects.append(stream_id, [Envelope("Bumped", {"by": 1})], expected_seq=seq).last_seq
            Snapshot.objects.save_state(stream_id, tip, {"n": 7})
        calls.append(seq)

    monkeypatch.setattr(RetentionStore, "resnapshot", then_old_code)
    code, doc, _ = loom("--stream", "ResnapTally-late")
    assert code == 0 and doc["resnapshotted"] == 1 and calls == [5, 6]
    assert snapshots("ResnapTally-late")[-2:] == [(5, {"n": 6, "bumps": 6}), (6, {"n": 7, "bumps": 7})]


def test_bad_options_are_usage_errors_and_unknown_targets_are_refusals():
    assert loom("--state", "NoSuchState")[0] == 1
    assert loom("--state", "NoSuchState")[1]["type"] == "UnknownState"
    assert loom("--stream", "nobody-1")[1]["type"] == "UnknownStream"
    assert loom("--state", "ResnapTally", "--stream", "ResnapTally-Other-x")[0] == 1  # the longer prefix's
    assert loom("--state", "a\x00b")[0] == 2
    assert loom("--batch", "0")[0] == 2
    assert loom("--database", "other")[0] == 2  # not in DATABASES


TEXT = hs.one_of(hs.text(max_size=30), hs.sampled_from(["ResnapTally", "ResnapTally-", "ResnapTally-a", "*", ""]))


@hsettings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(state=hs.one_of(hs.none(), TEXT), stream=hs.one_of(hs.none(), TEXT))
def test_any_state_and_stream_text_is_an_exit_code_and_a_json_document_and_writes_nothing(state, stream):
    """Every snapshot fits here, so whatever the options, nothing may be written; never a traceback."""
    if not Event.objects.filter(stream_id="ResnapTally-hyp").exists():
        bumps(bump, "hyp", 6)
    before = rows("journal_snapshot"), rows("journal_event")
    args = [f"--{name}={value}" for name, value in (("state", state), ("stream", stream)) if value is not None]
    code, doc, _ = loom(*args)
    assert code in (0, 1, 2), doc
    assert (rows("journal_snapshot"), rows("journal_event")) == before


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_an_appender_racing_resnapshot_loses_nothing_and_every_snapshot_is_the_fold_of_its_seq():
    """Real commits, threads on one stream: two writers bump it (snapshots every 5 by the runtime), a re-snapshotter
    re-takes it over and over (--all: each run folds from seq 0 and claims the seq it folded), a reader replays it
    cold. Each bump adds 1, so every state read is n == version + 1 (a snapshot claiming a seq it did not fold would
    break it); at the end every snapshot row is the current fold of events 0..its seq, and nothing is lost."""
    bumps(bump, "race", 6)
    reads: list[tuple[int, int, int]] = []
    outcomes: list[str] = []
    errors = aggregate_states.race(bump, "race", lambda: outcomes.append(
        redo.resnapshot_stream(tally, "ResnapTally-race", "default", everything=True).action), reading("race", reads))
    assert errors == []
    assert outcomes and set(outcomes) == {"resnapshotted"}, set(outcomes)
    assert reads and all(n == b == v + 1 for n, b, v in reads), [r for r in reads if not r[0] == r[1] == r[2] + 1][:5]
    assert [e.seq for e in Event.objects.read("ResnapTally-race")] == list(range(86))
    for seq, state in snapshots("ResnapTally-race"):
        assert state == truth(tally, "ResnapTally-race", seq) == {"n": seq + 1, "bumps": seq + 1}, seq
    cache.clear()
    assert load(tally, "race").state == Tally(n=86, bumps=86)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_resnapshot_and_compaction_racing_appenders_on_one_stream_keep_every_snapshot_true(settings):
    """The same stream compacted as well (LOOM_COMPACT_AGGREGATES): writers bump it, a compactor compacts it in
    2-event batches, a re-snapshotter re-takes it (--all) until the stream is compacted (then it says so and keeps
    the snapshot), a reader replays it. Each bump adds 1 to n and to bumps, so a snapshot at seq s is true iff it
    holds n == bumps == s + 1: checked for every snapshot row left, and every read."""
    settings.LOOM_COMPACT_AGGREGATES = ["ResnapTally"]
    settings.LOOM_COMPACT_BATCH = 2
    bumps(bump, "both", 3)  # no snapshot yet: the first compaction waits for one
    reads: list[tuple[int, int, int]] = []
    outcomes: list[str] = []
    errors = aggregate_states.race(bump, "both", lambda: compaction.run("default"), lambda: outcomes.append(
        redo.resnapshot_stream(tally, "ResnapTally-both", "default", everything=True).action), reading("both", reads))
    assert errors == []
    assert outcomes and set(outcomes) <= {"resnapshotted", "skipped"}, set(outcomes)
    assert reads and all(n == b == v + 1 for n, b, v in reads), [r for r in reads if not r[0] == r[1] == r[2] + 1][:5]
    assert all(state == {"n": seq + 1, "bumps": seq + 1} for seq, state in snapshots("ResnapTally-both"))
    kept = [e.seq for e in Event.objects.read("ResnapTally-both")]
    assert kept[0] > 0 and kept == list(range(kept[0], 83))  # compacted, nothing lost after its snapshot
    cache.clear()
    assert load(tally, "both").state == Tally(n=83, bumps=83)
