"""The cross-stream coalescer: every caller gets its own outcome, statements stay all-or-nothing."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from journal import coalesce
from journal.coalesce import Coalescer, CoalescerClosed, _Request
from journal.envelopes import AppendItem, Envelope
from journal.exceptions import InvalidPayload, SequenceConflict, StaleFence
from journal.flows import flow
from journal.models import Event, Fence
from journal.store import store_for


def rows(prefix: str) -> list[tuple[str, int]]:
    return list(Event.objects.filter(stream_id__startswith=prefix).order_by("stream_id", "seq")
                .values_list("stream_id", "seq"))


def request(stream_id: str, token: int | None = None, expected: int | None = None) -> _Request:
    item = AppendItem.build(stream_id, Envelope("Step", {"s": stream_id}), token, expected)
    return _Request(coalesce.APPEND, stream_id, (item, store_for().encode([item])[0]))


@pytest.mark.django_db(transaction=True)
def test_one_refused_row_fails_only_its_caller_and_the_rest_are_written():
    """A stale fence in a merged batch: that caller gets StaleFence, every other caller its seq."""
    for n in range(4):
        Event.objects.open_stream(f"c:{n}", Envelope("Opened"))
    Fence.objects.advance("c:2")  # c:2's writer below still holds token 1
    appender = Coalescer(max_batch=16, flushers=1)
    batch = [request(f"c:{n}", token=1) for n in range(4)]
    appender._flush(batch)
    assert isinstance(batch[2].error, StaleFence)
    assert [r.result.first_seq for r in batch if r is not batch[2]] == [1, 1, 1]
    assert all(r.done.is_set() for r in batch)
    assert appender.statements == 2 and appender.retries == 1  # refused, then written without c:2
    assert rows("c:") == [("c:0", 0), ("c:0", 1), ("c:1", 0), ("c:1", 1), ("c:2", 0), ("c:3", 0), ("c:3", 1)]


@pytest.mark.django_db(transaction=True)
def test_a_refused_statement_writes_nothing_before_the_retry():
    """All-or-nothing per statement: the refused attempt leaves no row, the retry writes each once."""
    Event.objects.append("s:a", Envelope("One"))
    Event.objects.append("s:b", Envelope("One"))
    appender = Coalescer(max_batch=16, flushers=1)
    batch = [request("s:a", expected=0), request("s:b", expected=5), request("s:c", expected=-1)]
    appender._flush(batch)
    assert isinstance(batch[1].error, SequenceConflict)
    assert (batch[0].result.first_seq, batch[2].result.first_seq) == (1, 0)
    assert rows("s:") == [("s:a", 0), ("s:a", 1), ("s:b", 0), ("s:c", 0)]


@pytest.mark.django_db(transaction=True)
def test_threads_get_their_own_results_through_the_flush_threads():
    """Several threads append through one coalescer; each gets its stream's seqs, nothing is lost."""
    with Coalescer(max_batch=4, flushers=2) as appender:
        results: dict[int, list[int]] = {}

        def writer(n: int) -> None:
            results[n] = [appender.append(f"t:{n}", Envelope("Step"), expected_seq=i - 1).first_seq
                          for i in range(5)]

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert results == {n: [0, 1, 2, 3, 4] for n in range(6)}
    assert len(rows("t:")) == 30
    assert appender.batched_requests == 30


@pytest.mark.django_db(transaction=True)
def test_requests_to_one_stream_are_written_in_turn_not_in_one_statement():
    """Two threads on the same unguarded stream: both succeed, seqs contiguous (never in one batch)."""
    with Coalescer(max_batch=16, flushers=2) as appender:
        def writer() -> None:
            for _ in range(10):
                appender.append("same", Envelope("Step"))

        threads = [threading.Thread(target=writer) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert [seq for _, seq in rows("same")] == list(range(20))


@pytest.mark.django_db(transaction=True)
def test_bad_payload_is_refused_in_the_callers_thread():
    """Validation happens before queueing: nothing starts, nothing is written."""
    appender = Coalescer(flushers=1)
    with pytest.raises(InvalidPayload):
        appender.append("bad", Envelope("Step", {"x": object()}))
    assert appender._threads == [] and appender.statements == 0
    assert rows("bad") == []


@pytest.mark.django_db(transaction=True)
def test_a_caller_inside_a_transaction_appends_directly_and_rolls_back_with_it():
    """Coalesced rows would commit on another connection; inside atomic() the append stays in it."""
    appender = Coalescer(flushers=1)
    with pytest.raises(RuntimeError), transaction.atomic():
        appender.append("tx", Envelope("Step"))
        assert rows("tx") == [("tx", 0)]
        raise RuntimeError("roll back")
    assert rows("tx") == []
    assert appender._threads == []


@pytest.mark.django_db(transaction=True)
def test_closed_coalescer_refuses_appends():
    appender = Coalescer(flushers=1)
    appender.append("x", Envelope("Step"))
    appender.close()
    with pytest.raises(CoalescerClosed):
        appender.append("x", Envelope("Step"))
    assert rows("x") == [("x", 0)]


@pytest.mark.django_db(transaction=True)
def test_on_by_default_and_a_lone_caller_starts_no_thread(settings):
    """LOOM_COALESCE is on by default (issue 16) and adaptive: a caller alone writes its request
    itself, counted by the shared coalescer, and no flush thread starts; LOOM_COALESCE=false writes
    directly with no coalescer at all."""
    coalesce.close_shared()
    assert coalesce.enabled() is True
    try:
        assert coalesce.append_item(AppendItem.build("plain", Envelope("Step"))).first_seq == 0
        assert Event.objects.append("plain", Envelope("Step")).first_seq == 1
        shared = coalesce.running()
        assert shared is not None and (shared.statements, shared.direct) == (2, 2)
        assert not [t for t in threading.enumerate() if t.name.startswith("loom-coalesce")]
    finally:
        coalesce.close_shared()
    settings.LOOM_COALESCE = False
    assert coalesce.enabled() is False
    coalesce.append_item(AppendItem.build("plain", Envelope("Step")))
    Event.objects.append("plain", Envelope("Step"))
    assert coalesce._shared == {}
    assert rows("plain") == [("plain", n) for n in range(4)]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_stale_writer_among_many_waiting_ones_fails_alone():
    """On PostgreSQL, requests that piled up behind a busy flush thread share one statement; the
    one stale writer among them gets StaleFence and every other writer's event is written."""
    for n in range(9):
        Event.objects.open_stream(f"p:{n}", Envelope("Opened"))
    Fence.objects.advance("p:5")
    appender = Coalescer(max_batch=16, flushers=1)
    outcomes: dict[int, object] = {}

    def writer(n: int) -> None:
        try:
            outcomes[n] = appender.append(f"p:{n}", Envelope("Step"), fence_token=1).first_seq
        except StaleFence as exc:
            outcomes[n] = exc

    with transaction.atomic(), connection.cursor() as cursor:
        # Hold p:0's fence row: a fenced append takes FOR KEY SHARE, so the flush thread's first
        # statement (p:0 alone) waits here while the other writers queue up.
        cursor.execute("SELECT 1 FROM journal_fence WHERE stream_id = 'p:0' FOR UPDATE")
        gate = threading.Thread(target=writer, args=(0,))
        gate.start()
        while not appender._inflight:
            threading.Event().wait(0.005)
        threads = [threading.Thread(target=writer, args=(n,)) for n in range(1, 9)]
        for thread in threads:
            thread.start()
        while len(appender._pending) < 8:
            threading.Event().wait(0.005)
    for thread in [gate, *threads]:
        thread.join()
    appender.close()
    assert isinstance(outcomes.pop(5), StaleFence)
    assert outcomes == {n: 1 for n in range(9) if n != 5}
    assert appender.statements == 3  # p:0 alone; the eight together (refused); seven again
    assert len(rows("p:")) == 9 + 8


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_many_threads_share_few_connections_on_postgres():
    """128 writer threads through 2 flush threads: every event stored once, seqs contiguous, far
    fewer statements than appends, and no connection per writer (PostgreSQL allows 100 here)."""
    writers, each = 128, 8
    for n in range(writers):
        Event.objects.open_stream(f"m:{n}", Envelope("Opened"))
    errors: list[BaseException] = []
    with Coalescer(max_batch=16, flushers=2) as appender:
        def writer(n: int) -> None:
            try:
                for _ in range(each):
                    appender.append(f"m:{n}", Envelope("Step"), fence_token=1)
            except BaseException as exc:
                errors.append(exc)
            finally:  # a writer that found the coalescer idle wrote alone on its own connection
                connection.close()

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(writers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert errors == []
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*), count(DISTINCT stream_id) FROM journal_event WHERE stream_id LIKE 'm:%%'")
        assert cursor.fetchone() == (writers * (each + 1), writers)
        cursor.execute("SELECT count(*) FROM (SELECT stream_id FROM journal_event WHERE stream_id LIKE 'm:%%'"
                       " GROUP BY stream_id HAVING max(seq) + 1 <> count(*)) gaps")
        assert cursor.fetchone()[0] == 0
    assert appender.batched_requests == writers * each
    assert appender.statements < writers * each


@flow("test.coalesce.three_steps")
def three_steps(ctx, input):
    """Three steps: the second and third completions are mid-run appends, the coalesced write."""
    return sum(ctx.step(f"s{n}", lambda n=n: n) for n in range(3))


@pytest.mark.django_db(transaction=True)
def test_durable_flows_append_through_the_coalescer_when_configured(settings):
    """LOOM_COALESCE on: a run's mid-run appends go through the shared coalescer; the run completes
    with the same contiguous log as without it."""
    from journal.flows import ownership, start

    installed = ownership.get_ownership()
    ownership.set_ownership(None)  # about the write path; leases have their own suite
    settings.LOOM_COALESCE = True
    try:
        outcome = start("test.coalesce.three_steps", {}, execution_id="co:1")
        coalesced = coalesce.shared_appender().batched_requests
        coalesce.close_shared()
        settings.LOOM_COALESCE = False
        plain = start("test.coalesce.three_steps", {}, execution_id="co:2")
    finally:
        coalesce.close_shared()
        ownership.set_ownership(installed)
    assert (outcome.status, outcome.result, plain.result) == ("completed", 3, 3)
    assert coalesced >= 1
    assert [seq for _, seq in rows("co:1")] == [seq for _, seq in rows("co:2")] == list(range(len(rows("co:1"))))


# -- the flows kinds: bootstraps and settles of many executions in one statement (PostgreSQL) --------

@flow("test.coalesce.one_step")
def one_step(ctx, input):
    """One step: a fresh run writes exactly a bootstrap and a settle."""
    return ctx.step("only", lambda: 1)


@pytest.fixture
def no_ownership():
    """These tests are about the write path; leases have their own suite."""
    from journal.flows import ownership

    installed = ownership.get_ownership()
    ownership.set_ownership(None)
    coalesce.close_shared()
    yield
    coalesce.close_shared()
    ownership.set_ownership(installed)


def boot_request(execution_id: str) -> _Request:
    from journal.flows import writer
    from journal.store.base import ExecutionBoot

    item = AppendItem.build(execution_id, [Envelope("EXECUTION_STARTED", {"input": {}}),
                                           Envelope("STEP_STARTED", {"step": "only", "pos": 0})])
    boot = ExecutionBoot(item, store_for().encode([item])[0], "test.coalesce.one_step", "running", "{}", None, "",
                         False)
    return _Request(writer.BOOTSTRAP, execution_id, boot)


def settle_request(execution_id: str, token: int, tip: int) -> _Request:
    from journal.flows import writer
    from journal.store.base import ExecutionSettle

    item = AppendItem.build(execution_id, [Envelope("EXECUTION_COMPLETED", {"result": 1})], token, tip)
    return _Request(writer.SETTLE, execution_id,
                    ExecutionSettle(item, store_for().encode([item])[0], "completed", "1", ""))


def headers(prefix: str) -> dict[str, str]:
    from journal.models import Execution

    return dict(Execution.objects.filter(id__startswith=prefix).values_list("id", "status"))


def started(prefix: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for sid in Event.objects.filter(stream_id__startswith=prefix, type="EXECUTION_STARTED").values_list(
            "stream_id", flat=True):
        counts[sid] = counts.get(sid, 0) + 1
    return counts


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_batch_of_bootstraps_refuses_only_the_existing_id(no_ownership):
    """One BOOT_MANY statement: the id that exists gets StreamExists, the others start in the same
    statement (no retry); one EXECUTION_STARTED each and headers only for the winners."""
    from journal.exceptions import StreamExists
    from journal.flows import start

    assert start("test.coalesce.one_step", {}, execution_id="b:2").status == "completed"
    appender = Coalescer(max_batch=16, flushers=1)
    batch = [boot_request(f"b:{n}") for n in range(5)]
    appender._flush(batch)
    assert isinstance(batch[2].error, StreamExists)
    assert [r.result for r in batch if r is not batch[2]] == [1, 1, 1, 1]
    assert appender.statements == 1 and appender.retries == 0
    assert started("b:") == {f"b:{n}": 1 for n in range(5)}
    assert headers("b:") == {"b:2": "completed", **{f"b:{n}": "running" for n in (0, 1, 3, 4)}}
    assert Event.objects.filter(stream_id="b:2").count() == 4  # the existing execution is untouched


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_bootstrap_over_an_aggregate_stream_fails_alone_and_the_rest_start(no_ownership):
    """An id with events but no fence fails the unique index for the whole statement: that caller
    gets StreamExists and the others are written again without it."""
    from journal.exceptions import StreamExists

    Event.objects.append("g:1", Envelope("Opened"))  # an aggregate stream: seq 0, no fence
    appender = Coalescer(max_batch=16, flushers=1)
    batch = [boot_request(f"g:{n}") for n in range(3)]
    appender._flush(batch)
    assert isinstance(batch[1].error, StreamExists)
    assert (batch[0].result, batch[2].result) == (1, 1)
    assert appender.statements == 2 and appender.retries == 1
    assert headers("g:") == {"g:0": "running", "g:2": "running"}
    assert rows("g:1") == [("g:1", 0)]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_batch_of_settles_refuses_only_the_stale_fence_and_keeps_its_header(no_ownership):
    """SETTLE_MANY with one stale token: that caller gets StaleFence, its header stays running;
    every other execution is settled (events and header) in the retry without it."""
    appender = Coalescer(max_batch=16, flushers=1)
    boots = [boot_request(f"s:{n}") for n in range(4)]
    appender._flush(boots)
    Fence.objects.advance("s:1")  # a resume took s:1 over; its first owner still holds token 1
    batch = [settle_request(f"s:{n}", token=1, tip=1) for n in range(4)]
    appender._flush(batch)
    assert isinstance(batch[1].error, StaleFence)
    assert [r.result.first_seq for r in batch if r is not batch[1]] == [2, 2, 2]
    assert appender.statements == 3 and appender.retries == 1  # boots; refused settle; settle without s:1
    assert headers("s:") == {"s:0": "completed", "s:1": "running", "s:2": "completed", "s:3": "completed"}
    assert [seq for _, seq in rows("s:1")] == [0, 1]


def _gated_starts(ids: list[str], gate_id: str) -> dict[str, object]:
    """Start `gate_id` and then `ids`, each in its own thread, while the test holds the gate's fence
    insert open: the flush thread waits on it and every other bootstrap piles up behind it, so they
    share one statement. Returns each id's outcome or exception."""
    from journal.flows import start

    outcomes: dict[str, object] = {}

    def run(execution_id: str) -> None:
        try:
            outcomes[execution_id] = start("test.coalesce.one_step", {}, execution_id=execution_id)
        except Exception as exc:
            outcomes[execution_id] = exc
        finally:
            connection.close()

    coalescer = coalesce.shared_coalescer()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("INSERT INTO journal_fence (stream_id, token, created_at) VALUES (%s, 1, now())", [gate_id])
        gate = threading.Thread(target=run, args=(gate_id,))
        gate.start()
        while not coalescer._inflight:
            threading.Event().wait(0.005)
        threads = [threading.Thread(target=run, args=(eid,)) for eid in ids]
        for thread in threads:
            thread.start()
        while len(coalescer._pending) < len(ids):
            threading.Event().wait(0.005)
        transaction.set_rollback(True)  # the gate's start goes through once the flush thread may
    for thread in [gate, *threads]:
        thread.join()
    return outcomes


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_racing_starts_through_the_coalescer_refuse_only_the_existing_id(no_ownership, settings):
    """End to end through start(): starts that pile up share a bootstrap statement; the one whose
    id exists gets ExecutionExists, the others complete, one EXECUTION_STARTED per id."""
    from journal.flows import start
    from journal.flows.errors import ExecutionExists

    start("test.coalesce.one_step", {}, execution_id="r:3")
    settings.LOOM_COALESCE, settings.LOOM_COALESCE_FLUSHERS = True, 1
    outcomes = _gated_starts([f"r:{n}" for n in range(1, 7)], "r:0")
    coalescer = coalesce.shared_coalescer()
    assert isinstance(outcomes.pop("r:3"), ExecutionExists)
    assert {eid: o.status for eid, o in outcomes.items()} == {f"r:{n}": "completed" for n in range(7) if n != 3}
    assert coalescer.kind_statements["flows.bootstrap"] == 2  # the gate alone, then the six together
    assert started("r:") == {f"r:{n}": 1 for n in range(7)}
    assert set(headers("r:").values()) == {"completed"}


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_coalesced_one_step_flow_costs_fewer_statements_than_direct(no_ownership, settings):
    """Direct, a 1-step run is 2 statements on the caller's connection (bootstrap, settle); through
    the coalescer the runs that pile up share statements, so there are fewer than 2 per run."""
    from django.test.utils import CaptureQueriesContext

    from journal.flows import start

    with CaptureQueriesContext(connection) as direct:
        start("test.coalesce.one_step", {}, execution_id="q:direct")
    assert len(direct.captured_queries) == 2
    settings.LOOM_COALESCE, settings.LOOM_COALESCE_FLUSHERS = True, 1
    ids = [f"q:{n}" for n in range(1, 9)]
    with CaptureQueriesContext(connection) as caller:
        outcomes = _gated_starts(ids, "q:0")
    coalescer = coalesce.shared_coalescer()
    assert {o.status for o in outcomes.values()} == {"completed"}
    assert [q for q in caller.captured_queries if "journal_event" in q["sql"]] == []  # none on the caller's
    assert coalescer.batched_requests == 2 * 9  # every run's bootstrap and settle went through it
    assert coalescer.statements < 2 * 9


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_many_threads_run_flows_through_the_coalescer_on_postgres(no_ownership, settings):
    """96 threads x 3 runs of 1- and 3-step flows through 2 flush threads: every run completes, its
    log is 2n+2 contiguous events and its header settled, with far fewer statements than writes."""
    from journal.flows import start

    settings.LOOM_COALESCE = True
    errors: list[BaseException] = []

    def runner(n: int) -> None:
        try:
            for i in range(3):
                name = "test.coalesce.one_step" if n % 2 else "test.coalesce.three_steps"
                outcome = start(name, {}, execution_id=f"mt:{n}:{i}")
                assert outcome.status == "completed", outcome
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=runner, args=(n,)) for n in range(96)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    coalescer = coalesce.shared_coalescer()
    assert errors == []
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*), count(DISTINCT stream_id) FROM journal_event WHERE stream_id LIKE 'mt:%%'")
        assert cursor.fetchone() == (48 * 3 * 4 + 48 * 3 * 8, 96 * 3)
        cursor.execute("SELECT count(*) FROM (SELECT stream_id FROM journal_event WHERE stream_id LIKE 'mt:%%'"
                       " GROUP BY stream_id HAVING max(seq) + 1 <> count(*)) gaps")
        assert cursor.fetchone()[0] == 0
    assert set(headers("mt:").values()) == {"completed"} and len(headers("mt:")) == 96 * 3
    assert coalescer.batched_requests == 48 * 3 * 2 + 48 * 3 * 4
    assert coalescer.statements < coalescer.batched_requests


def test_a_batch_holds_one_kind_and_a_stream_keeps_its_arrival_order():
    """Batches never mix kinds; a request queued behind another kind's request of its stream waits
    for it, and a stream in flight on another flush thread is held back (no database needed)."""
    coalescer = Coalescer(max_batch=3, flushers=1)
    queued = [_Request("a", "s1", 1), _Request("b", "s2", 2), _Request("a", "s2", 3), _Request("a", "s3", 4),
              _Request("a", "s4", 5), _Request("a", "s5", 6)]
    coalescer._pending.extend(queued)
    coalescer._inflight.add("s3")
    first = coalescer._take_locked()
    assert [r.payload for r in first] == [1, 5, 6]  # s2's "a" waits behind its "b"; s3 is in flight
    assert [r.payload for r in coalescer._pending] == [2, 3, 4]
    coalescer._inflight.discard("s3")
    for request in first:
        coalescer._inflight.discard(request.key)
    assert [r.payload for r in coalescer._take_locked()] == [2]


def test_the_old_name_coalescing_appender_still_answers_with_a_deprecation_warning():
    """`CoalescingAppender` (the Coalescer's first name) is the Coalescer for one more release, and says it goes."""
    with pytest.warns(DeprecationWarning, match="use Coalescer"):
        from journal.coalesce import CoalescingAppender
    assert CoalescingAppender is Coalescer
    with pytest.raises(AttributeError):
        coalesce.NoSuchName  # noqa: B018
