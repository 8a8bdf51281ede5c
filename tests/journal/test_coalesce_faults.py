"""The coalescer under faults: manual transactions, foreign row locks, dropped connections, fork.

Each test reproduces one reviewer finding of issue 16 (S1-S4) against a real database.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from contextlib import contextmanager

import pytest
from django.db import connection, connections, transaction

from journal import coalesce
from journal.coalesce import Coalescer
from journal.envelopes import Envelope
from journal.exceptions import SequenceConflict
from journal.models import Event

BLOCK = "tests.block"


class _Hold:
    """The payload of a BLOCK request: its executor signals `entered` and waits for `release`."""

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()


def _hold_executor(using: str, payloads: list[_Hold]) -> list[None]:
    for hold in payloads:
        hold.entered.set()
        hold.release.wait(60)
    return [None] * len(payloads)


coalesce.register_kind(BLOCK, _hold_executor)


@contextmanager
def busy(coalescer: coalesce.Coalescer):
    """Keep one statement of the coalescer in flight (a BLOCK request that waits), so that every
    other request finds it busy and queues for the flush threads instead of writing alone."""
    hold = _Hold()
    thread = threading.Thread(target=coalescer.submit, args=(BLOCK, "busy", hold))
    thread.start()
    assert hold.entered.wait(30)
    try:
        yield
    finally:
        hold.release.set()
        thread.join(30)


def rows(prefix: str) -> list[tuple[str, int]]:
    return list(Event.objects.filter(stream_id__startswith=prefix).order_by("stream_id", "seq")
                .values_list("stream_id", "seq"))


# -- S1: autocommit off is a transaction too ------------------------------------------------------
def assert_rolled_back(prefix: str) -> None:
    """The caller's rollback took its appends with it, and the coalescer wrote nothing. On SQLite too:
    Django's atomic() with autocommit off and no write yet opens the transaction with a SAVEPOINT whose
    RELEASE commits; the runtime's atomic blocks (journal/atomic.py) begin the transaction first."""
    coalesced = coalesce.running().kind_statements.get(coalesce.APPEND, 0)
    assert coalesced == 0
    assert rows(prefix) == []


@pytest.mark.django_db(transaction=True)
def test_an_append_with_autocommit_off_rolls_back_with_its_caller_while_the_coalescer_is_busy():
    """set_autocommit(False) opens a transaction without an atomic block: the append must stay on
    the caller's connection, or it commits on a flush thread's although the caller rolls back."""
    with busy(coalesce.shared_coalescer()):
        transaction.set_autocommit(False)
        try:
            assert Event.objects.append("manual:a", Envelope("One")).first_seq == 0
            transaction.rollback()
        finally:
            transaction.set_autocommit(True)
    assert_rolled_back("manual:")


@pytest.mark.django_db(transaction=True)
def test_two_appends_to_one_stream_with_autocommit_off_do_not_deadlock():
    """The first append's row is uncommitted on the caller's connection; a flush thread writing the
    second would wait for it while the caller waits for the flush thread."""
    outcome: list = []

    def manual() -> None:
        try:
            transaction.set_autocommit(False)
            first = Event.objects.append("manual:b", Envelope("One"))
            with busy(coalesce.shared_coalescer()):
                second = Event.objects.append("manual:b", Envelope("Two"))
            transaction.rollback()
            outcome.extend([first.first_seq, second.first_seq])
        except BaseException as exc:  # reported below
            outcome.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=manual, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "the second append of the manual transaction never returned"
    assert outcome == [0, 1]
    assert_rolled_back("manual:")


# -- S3: a stream locked by another transaction stalls nobody else ---------------------------------
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_appends_to_unrelated_streams_complete_while_another_connection_holds_two_streams():
    """Another connection holds uncommitted appends to H1 and H2. Appends to them wait, as they
    would directly; appends to other streams complete meanwhile (before: both statement slots
    waited on H1/H2's row locks and nothing of this process could write)."""
    held = ["hol:H1", "hol:H2"]
    for stream in held:
        Event.objects.append(stream, Envelope("Opened"))
    holding, release = threading.Event(), threading.Event()

    def holder() -> None:
        try:
            with transaction.atomic():
                for stream in held:
                    Event.objects.append(stream, Envelope("Held"))
                holding.set()
                release.wait(120)
        finally:
            connection.close()

    outcomes: dict[str, object] = {}

    def append(stream: str) -> None:
        try:
            outcomes[stream] = Event.objects.append(stream, Envelope("X")).first_seq
        except SequenceConflict as exc:
            outcomes[stream] = exc
        finally:
            connection.close()

    holder_thread = threading.Thread(target=holder, daemon=True)
    holder_thread.start()
    assert holding.wait(30)
    blocked = [threading.Thread(target=append, args=(s,), daemon=True) for s in held]
    free = [threading.Thread(target=append, args=(f"hol:free-{n}",), daemon=True) for n in range(10)]
    try:
        for thread in blocked:
            thread.start()
        with connection.cursor() as cursor:
            for _ in range(1000):  # until both wait for the holder, one of them handed back to its caller
                cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                               "AND wait_event_type = 'Lock'")
                shared = coalesce.running()
                if cursor.fetchone()[0] == 2 and getattr(shared, "fallbacks", 0) >= 1:
                    break
                time.sleep(0.01)
        for thread in free:
            thread.start()
        deadline = time.monotonic() + 30
        for thread in free:
            thread.join(max(0.0, deadline - time.monotonic()))
        finished = sorted(s for s in outcomes if "free" in s)
        assert not release.is_set()
        assert finished == sorted(f"hol:free-{n}" for n in range(10))
        assert all(outcomes[s] == 0 for s in finished)
        assert not any(s in outcomes for s in held)  # still waiting for the holder, as direct
    finally:
        release.set()
        holder_thread.join(30)
        for thread in blocked + free:
            thread.join(30)
    # After the holder's commit the waiters see its seq 1 (unguarded: a conflict, as direct).
    assert all(isinstance(outcomes[s], SequenceConflict) or outcomes[s] == 2 for s in held)
    assert coalesce.running().fallbacks == 1  # the held stream that queued; the other wrote alone


# -- S2: flush connections the server dropped are replaced ----------------------------------------
def _burst(appender: Coalescer, prefix: str, n: int = 8) -> list[BaseException]:
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            start.wait()
            appender.append(f"{prefix}-{i}", Envelope("X"))
        except BaseException as exc:  # counted
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    start = threading.Barrier(n)
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return errors


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_flush_connections_terminated_by_the_server_are_replaced_before_the_next_batch():
    """pg_terminate_backend on the flush threads' backends (as a restart or an idle timeout would):
    the next batches reconnect first and every caller's append is written."""
    def others() -> set[int]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                           "AND pid <> pg_backend_pid() AND backend_type = 'client backend'")
            return {row[0] for row in cursor.fetchall()}

    appender = Coalescer(max_batch=4, flushers=1)
    try:
        before = others()  # sessions earlier tests' threads may have left behind
        assert _burst(appender, "drop:a") == []
        assert appender._threads  # some appends queued: the flush thread has its connection
        flusher = sorted(others() - before)
        assert len(flusher) == 1  # the callers closed theirs
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", flusher)
            for _ in range(300):  # until the server has let it go
                cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", flusher)
                if cursor.fetchone()[0] == 0:
                    break
                time.sleep(0.01)
        time.sleep(0.2)  # the terminated backend's socket closes as its process exits
        assert _burst(appender, "drop:b") == []
        assert appender.reconnects == 1
        assert len(rows("drop:b")) == 8
    finally:
        appender.close()


# -- S4: a forked child has its own coalescer ------------------------------------------------------
def test_a_forked_child_does_not_reuse_the_parents_coalescer():
    parent = coalesce.shared_coalescer()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork of a threaded process
        pid = os.fork()
    if pid == 0:  # the child: no database, no pytest; its verdict is its exit code
        try:
            fresh = coalesce.running() is None and coalesce.shared_coalescer() is not parent
            os._exit(0 if fresh else 1)
        except BaseException:  # any failure is the child's verdict 2
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.django_db(transaction=True)
def test_every_journal_write_of_a_manual_transaction_rolls_back_with_it():
    """An open, a fenced append, a fence advance and a snapshot, in one transaction the caller opened
    with set_autocommit(False) and rolled back: nothing of it is stored, on SQLite as on PostgreSQL."""
    from journal.models import Fence, Snapshot

    transaction.set_autocommit(False)
    try:
        token, _ = Event.objects.open_stream("manual:c", Envelope("Opened"))
        Event.objects.append("manual:c", Envelope("Two"), fence_token=token)
        Fence.objects.advance("manual:c", token)
        Snapshot.objects.save_state("manual:c", 1, {"n": 2})
        transaction.rollback()
    finally:
        transaction.set_autocommit(True)
    assert rows("manual:") == []
    assert Fence.objects.current("manual:c") is None and Snapshot.objects.latest("manual:c") is None
