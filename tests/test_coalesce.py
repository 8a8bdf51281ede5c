"""The cross-stream coalescer: every caller gets its own outcome, statements stay all-or-nothing."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from journal import coalesce
from journal.coalesce import CoalescerClosed, CoalescingAppender, _Request
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
    return _Request(item, store_for().encode([item])[0])


@pytest.mark.django_db(transaction=True)
def test_one_refused_row_fails_only_its_caller_and_the_rest_are_written():
    """A stale fence in a merged batch: that caller gets StaleFence, every other caller its seq."""
    for n in range(4):
        Event.objects.open_stream(f"c:{n}", Envelope("Opened"))
    Fence.objects.advance("c:2")  # c:2's writer below still holds token 1
    appender = CoalescingAppender(max_batch=16, flushers=1)
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
    appender = CoalescingAppender(max_batch=16, flushers=1)
    batch = [request("s:a", expected=0), request("s:b", expected=5), request("s:c", expected=-1)]
    appender._flush(batch)
    assert isinstance(batch[1].error, SequenceConflict)
    assert (batch[0].result.first_seq, batch[2].result.first_seq) == (1, 0)
    assert rows("s:") == [("s:a", 0), ("s:a", 1), ("s:b", 0), ("s:c", 0)]


@pytest.mark.django_db(transaction=True)
def test_threads_get_their_own_results_through_the_flush_threads():
    """Several threads append through one coalescer; each gets its stream's seqs, nothing is lost."""
    with CoalescingAppender(max_batch=4, flushers=2) as appender:
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
    with CoalescingAppender(max_batch=16, flushers=2) as appender:
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
    appender = CoalescingAppender(flushers=1)
    with pytest.raises(InvalidPayload):
        appender.append("bad", Envelope("Step", {"x": object()}))
    assert appender._threads == [] and appender.statements == 0
    assert rows("bad") == []


@pytest.mark.django_db(transaction=True)
def test_a_caller_inside_a_transaction_appends_directly_and_rolls_back_with_it():
    """Coalesced rows would commit on another connection; inside atomic() the append stays in it."""
    appender = CoalescingAppender(flushers=1)
    with pytest.raises(RuntimeError), transaction.atomic():
        appender.append("tx", Envelope("Step"))
        assert rows("tx") == [("tx", 0)]
        raise RuntimeError("roll back")
    assert rows("tx") == []
    assert appender._threads == []


@pytest.mark.django_db(transaction=True)
def test_closed_coalescer_refuses_appends():
    appender = CoalescingAppender(flushers=1)
    appender.append("x", Envelope("Step"))
    appender.close()
    with pytest.raises(CoalescerClosed):
        appender.append("x", Envelope("Step"))
    assert rows("x") == [("x", 0)]


@pytest.mark.django_db(transaction=True)
def test_inert_by_default(settings):
    """Without LOOM_COALESCE the flows' append point writes directly: no coalescer, no thread."""
    coalesce.close_shared()
    assert coalesce.enabled() is False
    coalesce.append_item(AppendItem.build("plain", Envelope("Step")))
    assert coalesce._shared == {}
    assert not [t for t in threading.enumerate() if t.name.startswith("loom-coalesce")]
    settings.LOOM_COALESCE = True
    try:
        assert coalesce.append_item(AppendItem.build("plain", Envelope("Step"))).first_seq == 1
        assert coalesce.shared_appender().statements == 1
    finally:
        coalesce.close_shared()
    assert rows("plain") == [("plain", 0), ("plain", 1)]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_stale_writer_among_many_waiting_ones_fails_alone():
    """On PostgreSQL, requests that piled up behind a busy flush thread share one statement; the
    one stale writer among them gets StaleFence and every other writer's event is written."""
    for n in range(9):
        Event.objects.open_stream(f"p:{n}", Envelope("Opened"))
    Fence.objects.advance("p:5")
    appender = CoalescingAppender(max_batch=16, flushers=1)
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
    with CoalescingAppender(max_batch=16, flushers=2) as appender:
        def writer(n: int) -> None:
            try:
                for _ in range(each):
                    appender.append(f"m:{n}", Envelope("Step"), fence_token=1)
            except BaseException as exc:
                errors.append(exc)

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
