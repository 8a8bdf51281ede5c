"""The write path of issue 33: SQLite's lean per-event append (journal/store/sqlite_lean.py) against the
transactional path, and the ratio gate's coalescer-vs-raw rule (benchmarks/gate.py)."""

from __future__ import annotations

import functools
import itertools
import statistics
import threading
from datetime import UTC, datetime

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext, override_settings
from django.utils import timezone
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from journal.envelopes import AppendItem, Envelope
from journal.exceptions import AppendRefused, InvalidPayload, SequenceConflict
from journal.models import Event
from journal.store import sqlite_lean
from tests.journal import test_inputs_roundtrip as roundtrip

pytestmark = pytest.mark.django_db(transaction=True)
PROPERTY = settings(max_examples=40, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
_ids = itertools.count()


def _stream(shape: str, tag: str) -> str:
    """A fresh stream: `fenced` (open_stream: fence token 1, seq 0), `aggregate` (two events, no fence),
    or `none` (nothing written)."""
    sid = f"wp-{tag}-{next(_ids)}"
    if shape == "fenced":
        Event.objects.open_stream(sid, Envelope("Opened"))
    elif shape == "aggregate":
        Event.objects.append_batch([AppendItem(sid, (Envelope("A"), Envelope("B")), None, -1)])
    return sid


def _outcome(call) -> tuple:
    try:
        appended = call()
    except AppendRefused as exc:
        return ("refused", type(exc).__name__)
    return ("appended", appended.first_seq, appended.last_seq)


def _rows(sid: str) -> list[tuple]:
    return list(Event.objects.filter(stream_id=sid).order_by("seq").values_list("seq", "type"))


@PROPERTY
@given(shape=st.sampled_from(["fenced", "aggregate", "none"]), token=st.sampled_from([None, 1, 2]),
       expected=st.sampled_from([None, -1, 0, 1, 2]))
def test_an_append_in_autocommit_has_the_outcome_and_rows_of_the_transactional_path(shape, token, expected):
    """Any guards on any stream: the per-event append in autocommit (on SQLite the lean statement) and the
    same append inside a transaction (the IMMEDIATE transaction's reads and insert) give the same outcome
    and leave the same rows; a refusal writes nothing."""
    lean, locked = _stream(shape, "lean"), _stream(shape, "locked")
    before = _rows(lean)
    with override_settings(LOOM_COALESCE=False):
        got = _outcome(lambda: Event.objects.append(lean, Envelope("E", {"n": 1}), fence_token=token,
                                                    expected_seq=expected))

        def in_transaction():
            with transaction.atomic():
                return Event.objects.append(locked, Envelope("E", {"n": 1}), fence_token=token,
                                            expected_seq=expected)
        want = _outcome(in_transaction)
    assert got == want
    assert _rows(lean) == _rows(locked)
    if got[0] == "refused":
        assert _rows(lean) == before


def test_the_lean_statement_is_taken_only_where_nothing_observes_or_encloses_it():
    """One event in autocommit: lean (on SQLite). In a transaction, with several events, or while Django
    logs the queries (tests count statements): the transactional path."""
    if connection.vendor != "sqlite":
        pytest.skip("the lean statement is SQLite's (PostgreSQL's append is one statement already)")
    sid = _stream("fenced", "taken")
    one = [AppendItem(sid, (Envelope("E"),), 1, None)]
    connection.ensure_connection()
    assert sqlite_lean.lean_applies(connection, one)
    assert not sqlite_lean.lean_applies(connection, [AppendItem(sid, (Envelope("E"), Envelope("F")), 1, None)])
    with transaction.atomic():
        assert not sqlite_lean.lean_applies(connection, one)
    with CaptureQueriesContext(connection) as queries:
        assert not sqlite_lean.lean_applies(connection, one)
        with override_settings(LOOM_COALESCE=False):
            Event.objects.append(sid, Envelope("E"), fence_token=1)
    assert any("BEGIN" in q["sql"] for q in queries.captured_queries)  # the observed, transactional path
    with override_settings(LOOM_COALESCE=False):
        appended = Event.objects.append(sid, Envelope("E"), fence_token=1)  # lean
    assert (appended.first_seq, _rows(sid)[-1]) == (2, (2, "E"))


def test_concurrent_lean_appends_to_one_stream_leave_a_gapless_log():
    """Four threads on their own connections append 25 events each to one fenced stream: on SQLite every
    append reads its tip under the write lock, so none conflicts; on PostgreSQL a loser of the race for a
    seq gets SequenceConflict (nothing written) and tries again. Either way the seqs are 0..100 with no
    gap and no duplicate, and every caller got the seq it wrote."""
    sid = _stream("fenced", "race")
    got: list[int] = []
    conflicts: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def writer() -> None:  # LOOM_COALESCE is off around the threads (settings are process-wide)
        try:
            for _ in range(25):
                while True:
                    try:
                        appended = Event.objects.append(sid, Envelope("E"), fence_token=1)
                    except SequenceConflict:  # PostgreSQL: a concurrent writer took that seq; nothing written
                        with lock:
                            conflicts.append(1)
                        continue
                    break
                with lock:
                    got.append(appended.first_seq)
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=writer) for _ in range(4)]
    with override_settings(LOOM_COALESCE=False):
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert not errors
    assert sorted(got) == list(range(1, 101))
    assert [seq for seq, _ in _rows(sid)] == list(range(101))
    if connection.vendor == "sqlite":  # the write lock orders the guard reads with the insert: no race to lose
        assert not conflicts


def test_a_batch_reads_each_streams_tip_whatever_its_length():
    """The transactional path's tips (TIPS: one index seek per stream): a batch over a long stream, a
    short one and a new one appends each at its own next seq."""
    long, short = _stream("fenced", "long"), _stream("fenced", "short")
    Event.objects.append_batch([AppendItem(long, tuple(Envelope("E") for _ in range(300)), 1, 0)])
    new = f"wp-new-{next(_ids)}"
    out = Event.objects.append_batch([AppendItem(long, (Envelope("X"),), 1, 300),
                                      AppendItem(short, (Envelope("X"),), 1, 0),
                                      AppendItem(new, (Envelope("X"),), None, -1)])
    assert [(a.stream_id, a.first_seq) for a in out] == [(long, 301), (short, 1), (new, 0)]


def test_the_gate_holds_the_coalescer_against_the_raw_coalescer():
    """The rule pairs coalesced-64 with raw-coalescer repeat by repeat at 64 writers: passes at the
    measured shape, fails when every repeat is below the limit."""
    from benchmarks.compare import Cell
    from benchmarks.gate import RULES, evaluate

    rule = next(r for r in RULES if r.name == "coalescer vs raw")

    def cells(ours, raw):
        return [Cell("coalesced", "coalesced-64", {"writers": 64}, throughput=statistics.median(ours),
                     throughput_runs=tuple(ours)),
                Cell("coalesced", "raw-coalescer", {"writers": 64}, throughput=statistics.median(raw),
                     throughput_runs=tuple(raw))]
    (ok,) = evaluate(cells([6300, 5600, 6900, 6000, 6100], [10000] * 5), [rule])
    assert ok.verdict == "ok" and ok.value == pytest.approx(0.61)
    (slid,) = evaluate(cells([3000, 4000, 4500, 3500, 4200], [10000] * 5), [rule])
    assert slid.failed


@pytest.mark.postgres
def test_a_batch_rolled_back_on_a_lock_timeout_is_counted_once_per_request_written():
    """A flush statement that meets a row lock held by another transaction times out (lock_timeout),
    is re-sent request by request, and the still-blocked request is handed back to its caller. The
    counters then say how many requests were written exactly once (benchmarks' `written_once`, which
    the coalesced section verifies against the rows): the free one in a committed statement, the held
    one by its caller; the rolled-back statements' requests are `timed_out`."""
    from benchmarks.sections.coalesced import written_once
    from journal.coalesce import APPEND, Coalescer, _Request
    from journal.store import store_for

    held, free = _stream("fenced", "held"), _stream("fenced", "free")
    holding, release = threading.Event(), threading.Event()

    def holder() -> None:
        try:
            with transaction.atomic():
                Event.objects.append(held, Envelope("Held"), fence_token=1)
                holding.set()
                release.wait(60)
        finally:
            connection.close()

    holder_thread = threading.Thread(target=holder, daemon=True)
    holder_thread.start()
    assert holding.wait(30)
    coalescer = Coalescer(flushers=1)
    items = [AppendItem.build(sid, Envelope("X"), 1) for sid in (held, free)]
    requests = [_Request(APPEND, item.stream_id, (item, store_for().encode([item])[0])) for item in items]
    flush = threading.Thread(target=lambda: (coalescer._flush(requests), connection.close()), daemon=True)
    try:
        flush.start()
        flush.join(30)
    finally:
        release.set()
        holder_thread.join(30)
    assert not flush.is_alive()
    assert requests[0].handed_back and requests[1].result.first_seq == 1
    assert (coalescer.timed_out, coalescer.fallbacks) == (3, 1)  # the batch of 2, then the held one alone
    assert written_once(coalescer) == 2
    assert _rows(free) == [(0, "Opened"), (1, "X")] and _rows(held) == [(0, "Opened"), (1, "Held")]


@pytest.mark.postgres
def test_a_commit_that_waits_for_the_notify_lock_is_sent_again_whole_not_split(monkeypatch):
    """lock_timeout also fires while a commit waits for PostgreSQL's notification-queue lock, which
    every notifying commit takes (no row is locked: the error has no context). Such a batch is sent
    again whole, nothing having been written, instead of being split and handed back request by
    request as for a stream locked elsewhere. Driven for real: the flush connections' lock_timeout is
    1 ms while other connections notify in a loop; every append is written once, in order."""
    import psycopg

    from benchmarks.sections.coalesced import written_once
    from journal import coalesce

    monkeypatch.setattr(coalesce, "FLUSH_LOCK_TIMEOUT_MS", 1)
    settings_dict = connection.settings_dict
    stop = threading.Event()

    def notifier() -> None:
        with psycopg.connect(host=settings_dict["HOST"] or "127.0.0.1", port=settings_dict["PORT"] or 5432,
                             dbname=settings_dict["NAME"], user=settings_dict["USER"] or None,
                             autocommit=True) as conn:
            while not stop.is_set():
                conn.execute("SELECT pg_notify('loom_wp_probe', 'x')")

    sids = [_stream("fenced", "nq") for _ in range(12)]
    coalescer = coalesce.Coalescer(max_batch=16, flushers=2)
    errors: list[BaseException] = []
    seqs: dict[str, list[int]] = {sid: [] for sid in sids}

    def writer(sid: str) -> None:
        try:
            for _ in range(15):
                seqs[sid].append(coalescer.append(sid, Envelope("E"), fence_token=1).first_seq)
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    notifiers = [threading.Thread(target=notifier, daemon=True) for _ in range(3)]
    writers = [threading.Thread(target=writer, args=(sid,), daemon=True) for sid in sids]
    try:
        for thread in notifiers + writers:
            thread.start()
        for thread in writers:
            thread.join(120)
    finally:
        stop.set()
        for thread in notifiers:
            thread.join(30)
        coalescer.close()
    assert not errors
    assert all(seqs[sid] == list(range(1, 16)) for sid in sids)
    assert all([seq for seq, _ in _rows(sid)] == list(range(16)) for sid in sids)
    assert written_once(coalescer) == 12 * 15
    assert coalescer.fallbacks == 0  # no row was locked: nothing is handed back, whatever timed out


class _Text(str):
    """A str subclass: the encoders write it as the plain str."""


@settings(max_examples=300, deadline=None, database=None)
@given(value=st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.integers(min_value=-(10**30), max_value=10**30),
              st.floats(), st.text(), st.text().map(_Text), st.sampled_from([1e16, -0.0, 1e-7, 5e-324])),
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.tuples(inner, inner),
                            st.dictionaries(st.one_of(st.text(max_size=6), st.integers(-2, 2)), inner, max_size=5)),
    max_leaves=25))
def test_the_payload_encoder_made_once_writes_the_stdlib_encoders_text(value):
    """jsonvalues.dumps encodes with one C encoder made at import (issue 33) instead of JSONEncoder.encode's
    per-call one: for any value, the same text, or the same refusal."""
    from journal import jsonvalues
    from journal.exceptions import InvalidPayload

    def stored(fast: bool):
        saved = jsonvalues._FAST_ENCODER
        jsonvalues._FAST_ENCODER = saved if fast else None  # None: every payload through _ENCODER.encode
        try:
            return jsonvalues.dumps(value)
        except InvalidPayload as exc:
            return ("refused", str(exc))
        finally:
            jsonvalues._FAST_ENCODER = saved

    assert stored(True) == stored(False)


def test_a_cycle_is_refused_as_a_cycle_by_the_encoder_without_markers():
    """The encoder made once keeps no cycle markers: a cycle is refused all the same, with the stdlib's words."""
    from journal import jsonvalues
    from journal.exceptions import InvalidPayload

    loop: list = []
    loop.append(loop)
    with pytest.raises(InvalidPayload, match="Circular reference detected"):
        jsonvalues.dumps({"a": loop})


@PROPERTY
@given(shape=st.sampled_from(["fenced", "aggregate", "none"]), token=st.sampled_from([None, 1, 2]),
       expected=st.sampled_from([None, -1, 0, 1]), type_=st.sampled_from(["E", "e.v-2:x_y", "no spaces", "9lives"]),
       value=roundtrip.values)
def test_a_lean_append_reads_back_exactly_or_is_refused_by_name_with_nothing_written(shape, token, expected,
                                                                                    type_, value, monkeypatch):
    """The lean statement (SQLite, autocommit) against the same append in a transaction, for any guards and
    any payload the JSON rules accept or refuse: the same outcome (the same named error, or the same seqs),
    the same rows; an accepted event reads back as the documented normal form of its payload, stamped in
    Django's own datetime text; a refusal leaves the stream as it was. On SQLite every append whose payload
    passes the rules reaches the lean statement (a refused guard then goes on to the transactional path)."""
    taken: list[str] = []
    lean_append = sqlite_lean.lean_append

    def counted(connection_, item, text):
        taken.append(item.stream_id)
        return lean_append(connection_, item, text)

    monkeypatch.setattr(sqlite_lean, "lean_append", counted)
    lean, locked = _stream(shape, "lean"), _stream(shape, "locked")
    before = _rows(lean)
    with override_settings(LOOM_COALESCE=False):
        got = _named(lambda: Event.objects.append(lean, Envelope(type_, value), fence_token=token,
                                                  expected_seq=expected))

        def in_transaction():
            with transaction.atomic():
                return Event.objects.append(locked, Envelope(type_, value), fence_token=token, expected_seq=expected)
        want = _named(in_transaction)
    assert got == want
    assert _rows(lean) == _rows(locked)
    if got[0] != "appended":
        assert _rows(lean) == before
        return
    if connection.vendor == "sqlite":
        assert taken == [lean]
    event = Event.objects.read(lean)[-1]
    assert (event.seq, event.type) == (got[1], type_)
    assert roundtrip.same(event.payload, roundtrip.normal_form(value)), (value, event.payload)
    assert event.payload == Event.objects.read(locked)[-1].payload
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("SELECT recorded_at || '' FROM journal_event WHERE stream_id = %s AND seq = %s",
                           [lean, got[1]])  # as text (the column converter would parse it)
            (text,) = cursor.fetchone()
        assert str(datetime.fromisoformat(text)) == text  # Django's text of a naive UTC datetime


def _named(call) -> tuple:
    """An append's outcome: its seqs, or the name of the journal's error that refused it."""
    try:
        appended = call()
    except (AppendRefused, InvalidPayload) as exc:
        return ("refused", type(exc).__name__)
    return ("appended", appended.first_seq, appended.last_seq)


@pytest.mark.parametrize("use_tz", [True, False])
def test_the_lean_stamp_is_djangos_datetime_text_of_the_moment(use_tz):
    """sqlite_lean.stamp writes what Django's SQLite backend writes for timezone.now() (with USE_TZ and no
    database TIME_ZONE made directly, else through Django): the same text format, the same clock."""
    if connection.vendor != "sqlite":
        pytest.skip("the stamp is the SQLite store's (PostgreSQL binds datetimes)")
    with override_settings(USE_TZ=use_tz):
        connection.ensure_connection()
        low = connection.ops.adapt_datetimefield_value(timezone.now())
        text = sqlite_lean.stamp(connection)
        high = connection.ops.adapt_datetimefield_value(timezone.now())
        parsed = datetime.fromisoformat(text)
        assert parsed.tzinfo is None
        assert connection.ops.adapt_datetimefield_value(parsed.replace(tzinfo=UTC) if use_tz else parsed) == text
        assert low <= text <= high  # (a whole second has no .ffffff: its shorter text still sorts in place)


def test_a_manual_transaction_is_not_committed_by_the_lean_statement():
    """Autocommit off without an atomic block (set_autocommit(False)): the append is the transactional
    path's, inside the caller's transaction, so a rollback takes it back (the lean statement would have
    committed on its own)."""
    sid = _stream("fenced", "manual")
    with override_settings(LOOM_COALESCE=False):
        transaction.set_autocommit(False)
        try:
            Event.objects.append(sid, Envelope("E"), fence_token=1)
            assert _rows(sid)[-1] == (1, "E")
            transaction.rollback()
        finally:
            transaction.set_autocommit(True)
    assert _rows(sid) == [(0, "Opened")]


@settings(max_examples=40, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(steps=st.lists(st.sampled_from(["append", "append at its tip", "append at another tip", "another writer",
                                       "take over", "adopt the new token", "remove and reopen"]),
                      min_size=1, max_size=12))
@example(steps=["append", "remove and reopen", "append"])  # the guess is above the tip: it must not leave a gap
@example(steps=["append", "another writer", "append", "append at its tip"])  # below it: read again
@example(steps=["append", "take over", "append", "adopt the new token", "append"])  # a guess on a stale fence
def test_a_remembered_tip_is_a_guess_the_statement_checks(steps):
    """The lean statement writes at the seq this process last wrote to the stream (LEAN_APPEND_AT) and reads
    the tip again when that guess is wrong. Any mix of appends with and without an expected seq, writes the
    guess does not see (another writer's transaction, a removal and a reopening of the stream) and a takeover
    gives what one transaction would: the next seq, StaleFence or SequenceConflict, nothing written on a
    refusal, the log gapless."""
    from journal.models import Fence
    from journal.store import store_for

    sid = _stream("fenced", "tips")
    tip, fence, held = 0, 1, 1  # the stream's last seq and fence token, and the token our writer holds
    with override_settings(LOOM_COALESCE=False):
        for step in steps:
            if step == "another writer":
                with transaction.atomic():
                    Event.objects.append(sid, Envelope("Other"), fence_token=fence)
                tip += 1
            elif step == "take over":
                fence = Fence.objects.advance(sid)
            elif step == "adopt the new token":
                held = fence
            elif step == "remove and reopen":
                store_for().delete_streams(ids=[sid])
                Event.objects.open_stream(sid, Envelope("Opened"))
                tip, fence, held = 0, 1, 1
            else:
                expected = {"append": None, "append at its tip": tip, "append at another tip": tip - 1}[step]
                got = _outcome(functools.partial(Event.objects.append, sid, Envelope("E"), fence_token=held,
                                                 expected_seq=expected))
                if held != fence:
                    assert got == ("refused", "StaleFence"), step
                elif expected is not None and expected != tip:
                    assert got == ("refused", "SequenceConflict"), step
                else:
                    assert got == ("appended", tip + 1, tip + 1), step
                    tip += 1
            assert [seq for seq, _ in _rows(sid)] == list(range(tip + 1)), step
