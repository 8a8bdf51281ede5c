"""Compaction of aggregate streams (journal/compaction.py, docs/retention.md "Compaction"): exactly the events
before a stream's newest snapshot go, and nothing else; a load after it equals the load before; the readers of a
compacted stream (the runtime, the admin, Event.objects.read, the CLI) know where it starts; a snapshot that no
longer fits is a named error, never a partial replay; a `do` racing a compaction never loses an event
(PostgreSQL, real commits in threads); bad settings are named errors with the database unchanged."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.db import connection
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as hs

from journal import compaction, conf
from journal.aggregates import CompactedStream, State, cache, do, load, replay
from journal.envelopes import Envelope
from journal.flows import start
from journal.models import Compaction, Event, Snapshot
from tests.fixtures import privacy_fixtures as fx
from tests.fixtures import waits_flows as wf  # noqa: F401  (registers the waits.* flows)
from tests.journal import aggregate_states
from tests.journal.aggregate_states import Count

pytestmark = pytest.mark.django_db


counter, bump = aggregate_states.counter("CompactCounter", snapshot_every=5, compact=True)
plain, plain_bump = aggregate_states.counter("PlainCounter", snapshot_every=5)  # snapshots, not compacted


@pytest.fixture(autouse=True)
def _setup(settings, tmp_path, effects):
    settings.LOOM_FLOW_MODULES = ["tests.fixtures.waits_flows"]
    settings.LOOM_WAIT_INLINE_MAX = 0.0
    settings.LOOM_COMPACT_AGGREGATES = []
    settings.LOOM_CONTENT_DIR = str(tmp_path / "content")
    cache.clear()
    yield
    cache.clear()


def rows(table: str) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {table} ORDER BY 1")
        return cursor.fetchall()


def seqs(stream: str) -> list[int]:
    return [e.seq for e in Event.objects.read(stream)]


def bumps(action, id: str, times: int) -> None:
    for _ in range(times):
        do(action, id, {"by": 1})


def test_compaction_removes_exactly_the_events_before_the_newest_snapshot(settings):
    """23 commits: snapshots at seq 4, 9, 14, 19. Compaction keeps the snapshot at 19, its event and those after;
    another stream of the same state with no snapshot, a state that is not compacted and a flow's log keep
    every row."""
    settings.LOOM_COMPACT_BATCH = 4  # 19 events in five batches
    bumps(bump, "a", 23)
    bumps(bump, "short", 3)  # no snapshot yet
    bumps(plain_bump, "p", 12)
    start("waits.steps", {"n": 1}, execution_id="cmp-flow")
    before_load = replay(counter, "a").state
    assert [s.seq for s in Snapshot.objects.filter(stream_id="CompactCounter-a").order_by("seq")] == [4, 9, 14, 19]
    events_before = [r for r in rows("journal_event") if r[1] != "CompactCounter-a"]
    snapshots_before = [r for r in rows("journal_snapshot") if r[1] != "CompactCounter-a"]
    kept = [r for r in rows("journal_event") if r[1] == "CompactCounter-a" and r[2] >= 19]

    totals = compaction.run("default")

    assert totals == {"streams": 1, "events": 19, "snapshots": 3, "batches": 5}
    assert seqs("CompactCounter-a") == [19, 20, 21, 22]
    assert [r for r in rows("journal_event") if r[1] == "CompactCounter-a"] == kept  # the kept rows as they were
    assert [s.seq for s in Snapshot.objects.filter(stream_id="CompactCounter-a")] == [19]
    assert [r for r in rows("journal_event") if r[1] != "CompactCounter-a"] == events_before
    assert [r for r in rows("journal_snapshot") if r[1] != "CompactCounter-a"] == snapshots_before
    recorded = list(Compaction.objects.order_by("id").values_list("stream_id", "before_seq", "events", "snapshots"))
    assert recorded == [("CompactCounter-a", 19, 4, 0)] * 4 + [("CompactCounter-a", 19, 3, 3)]
    assert compaction.first_seq("CompactCounter-a") == 19
    cache.clear()
    assert load(counter, "a").state == before_load == Count(n=23)
    assert load(counter, "a").version == 22
    assert compaction.run("default") == {"streams": 0, "events": 0, "snapshots": 0, "batches": 0}  # idempotent

    # the stream goes on: appends after the compaction continue its seqs, a later compaction follows the snapshot
    bumps(bump, "a", 5)
    assert seqs("CompactCounter-a") == list(range(19, 28))
    compaction.run("default")
    assert seqs("CompactCounter-a")[0] == 24 and replay(counter, "a").state == Count(n=28)


def test_a_state_named_in_the_setting_is_compacted_and_a_state_not_named_is_not(settings):
    bumps(plain_bump, "s", 7)
    assert compaction.run("default")["events"] == 0
    settings.LOOM_COMPACT_AGGREGATES = ["PlainCounter"]
    assert compaction.run("default")["events"] == 4
    assert seqs("PlainCounter-s") == [4, 5, 6]
    assert replay(plain, "s").state == Count(n=7)


def test_a_snapshot_that_no_longer_fits_is_a_named_error_never_a_partial_replay():
    bumps(bump, "x", 12)
    compaction.run("default")
    assert seqs("CompactCounter-x") == [9, 10, 11]
    Snapshot.objects.filter(stream_id="CompactCounter-x").update(state={"n": "no longer an int"})
    cache.clear()
    with pytest.raises(CompactedStream) as caught:
        load(counter, "x")
    assert caught.value.first_seq == 9 and "no longer fits" in str(caught.value)
    with pytest.raises(CompactedStream):
        replay(counter, "x", use_snapshot=False)  # a replay from seq 0 of a compacted stream is refused too


def _append_bumps(stream: str, count: int) -> int:
    """Bumps written as another process would (not through this process's cache): the new tip."""
    return Event.objects.append(stream, [Envelope("Bumped", {"by": 1})] * count,
                                expected_seq=Event.objects.tip(stream)).last_seq


def test_a_load_whose_snapshot_was_compacted_between_its_two_reads_loads_the_newer_snapshot(monkeypatch):
    """The interleaving the runtime guards against, made to happen: a cold load reads the snapshot at seq 4, then
    (before it reads the events after 4) another process commits up to seq 14 with a snapshot there and compacts
    before it. The events read after 4 start at 14: the load sees the gap and loads again from the snapshot at 14,
    never folding seq 14.. onto the state at 4."""
    from journal.managers import SnapshotManager

    bumps(bump, "gap", 5)  # snapshot at 4
    original = SnapshotManager.latest
    interleaved = []

    def latest_then_compact(self, stream_id):
        found = original(self, stream_id)
        if not interleaved:
            interleaved.append(found.seq)
            tip = _append_bumps(stream_id, 10)
            Snapshot.objects.save_state(stream_id, tip, {"n": tip + 1})
            compaction.compact_stream(counter, stream_id, "default")
        return found

    monkeypatch.setattr(SnapshotManager, "latest", latest_then_compact)
    cache.clear()
    agg = load(counter, "gap")
    assert interleaved == [4] and seqs("CompactCounter-gap") == [14]
    assert agg.state == Count(n=15) and agg.version == 14


def test_a_cached_state_behind_a_compaction_loads_from_the_snapshot(django_capture_on_commit_callbacks):
    """This process cached the stream at seq 6; another process then wrote to seq 16, snapshotted and compacted.
    A fresh load reads after 6, finds the stream starting at 16, and loads from that snapshot."""
    with django_capture_on_commit_callbacks(execute=True):  # the cache is filled once the commit is done
        bumps(bump, "behind", 7)
    assert ("CompactCounter", "CompactCounter-behind") in cache
    tip = _append_bumps("CompactCounter-behind", 10)
    Snapshot.objects.save_state("CompactCounter-behind", tip, {"n": tip + 1})
    compaction.compact_stream(counter, "CompactCounter-behind", "default")
    assert seqs("CompactCounter-behind") == [16]
    agg = load(counter, "behind", fresh=True)
    assert agg.state == Count(n=17) and agg.version == 16


def test_a_stream_whose_snapshot_no_longer_fits_is_not_compacted():
    bumps(bump, "y", 7)
    Snapshot.objects.filter(stream_id="CompactCounter-y").update(state={"n": "nope"})
    before = rows("journal_event")
    done = compaction.compact_stream(counter, "CompactCounter-y", "default")
    assert done.events == 0 and "no longer fits" in done.skipped
    assert rows("journal_event") == before and not Compaction.objects.exists()


def test_a_sensitive_state_is_never_compacted_and_a_forgotten_subject_stays_forgotten(settings):
    """A sensitive state has no snapshot (a checkpoint would keep in clear what the log keeps sealed): naming it
    compacts nothing, so its events (sealed, shredded by forget) are all that hold the subject's data."""
    settings.LOOM_KEYS = [fx.KEY_A]
    settings.LOOM_COMPACT_AGGREGATES = ["*"]
    from journal.privacy import FORGOTTEN, forget, keys

    keys.cache.clear()
    for _ in range(3):
        do(fx.add_contact, "c1", {"email": "ann@example.com"}, actor="u-7")
    assert fx.contacts.name not in [st.name for st in compaction.compacted_states()]
    before = rows("journal_event")
    compaction.run("default")
    assert rows("journal_event") == before
    assert not Snapshot.objects.filter(stream_id__startswith=fx.contacts.prefix).exists()
    forget("u-7", by="test")
    keys.cache.clear()
    stored = [e.payload["email"] for e in Event.objects.read(fx.contacts.stream("c1"))]
    assert stored == [FORGOTTEN] * 3


def test_the_admin_history_and_the_cli_say_where_a_compacted_stream_starts(admin_client):
    bumps(bump, "h", 11)
    out = io.StringIO()
    call_command("loom", "retention", "compact", stdout=out)
    assert "compacted 1 stream(s), 9 event(s)" in out.getvalue()
    page = admin_client.get("/admin/journal/aggregatestream/CompactCounter/h/").content.decode()
    assert "Compacted before seq 9" in page
    assert "&quot;n&quot;: 11" in page or '"n": 11' in page
    status = io.StringIO()
    call_command("loom", "retention", "status", stdout=status)
    assert "compacted states: CompactCounter" in status.getvalue()
    assert "CompactCounter-h before seq 9, 9 event(s)" in status.getvalue()
    listing = admin_client.get("/admin/journal/compaction/").content.decode()
    assert "CompactCounter-h" in listing and "Compacted states: CompactCounter" in listing


BAD_NAMES = hs.one_of(
    hs.lists(hs.one_of(hs.integers(), hs.none(), hs.just(""), hs.just(" x"), hs.just("a\x00b")), min_size=1,
             max_size=3).map(lambda bad: ["CompactCounter", *bad]),
    hs.text(min_size=1, max_size=8).map(lambda name: [name, name]),
)


@hsettings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bad=BAD_NAMES)
def test_a_bad_compaction_setting_is_a_named_error_and_nothing_is_deleted(settings, bad):
    bumps(bump, "hyp", 6) if not Event.objects.filter(stream_id="CompactCounter-hyp").exists() else None
    before = rows("journal_event"), rows("journal_snapshot")
    settings.LOOM_COMPACT_AGGREGATES = bad
    with pytest.raises(conf.ConfigError, match="LOOM_COMPACT_AGGREGATES"):
        compaction.run("default")
    assert (rows("journal_event"), rows("journal_snapshot")) == before and not Compaction.objects.exists()


@hsettings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=hs.one_of(hs.integers(max_value=0), hs.just("ten"), hs.just(2.5j)))
def test_a_bad_compaction_batch_is_a_named_error_and_nothing_is_deleted(settings, batch):
    bumps(bump, "hypb", 6) if not Event.objects.filter(stream_id="CompactCounter-hypb").exists() else None
    before = rows("journal_event"), rows("journal_snapshot")
    settings.LOOM_COMPACT_BATCH = batch
    with pytest.raises(conf.ConfigError, match="LOOM_COMPACT_BATCH"):
        compaction.run("default")
    assert (rows("journal_event"), rows("journal_snapshot")) == before and not Compaction.objects.exists()


def test_a_bad_compact_declaration_is_a_named_error():
    from journal.aggregates import DeclarationError

    with pytest.raises(DeclarationError, match="needs snapshot_every"):
        State("CompactNoSnapshots", Count, compact=True)
    with pytest.raises(DeclarationError, match="True or False"):
        State("CompactNotBool", Count, snapshot_every=2, compact="yes")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_do_racing_a_compaction_of_the_same_stream_never_loses_or_half_removes(settings):
    """Real commits, three threads on one stream: writers bump it, a compactor compacts it in 2-event batches
    over and over, a cold reader replays it. Each bump adds 1, so every state read is n == version + 1 (a
    partial replay would break it); at the end nothing is lost and the kept events are contiguous up to the tip."""
    settings.LOOM_COMPACT_BATCH = 2
    bumps(bump, "race", 6)
    reads: list[tuple[int, int]] = []
    writes = [0, 0]

    def read() -> None:
        agg = replay(counter, "race")
        reads.append((agg.state.n, agg.version))

    errors = aggregate_states.race(bump, "race", lambda: compaction.run("default"), read, writes=writes)
    assert errors == []
    assert writes == [40, 40]
    assert reads and all(n == version + 1 for n, version in reads), [r for r in reads if r[0] != r[1] + 1][:5]
    compaction.run("default")
    cache.clear()
    agg = load(counter, "race")
    assert agg.state == Count(n=86) and agg.version == 85
    kept = seqs("CompactCounter-race")
    newest = Snapshot.objects.filter(stream_id="CompactCounter-race").order_by("-seq").first()
    assert kept == list(range(newest.seq, 86)) and kept[0] > 0
    assert list(Snapshot.objects.filter(stream_id="CompactCounter-race").values_list("seq", flat=True)) == [newest.seq]
    deleted = sum(Compaction.objects.filter(stream_id="CompactCounter-race").values_list("events", flat=True))
    assert deleted == newest.seq  # every event before the kept snapshot, each deleted once
