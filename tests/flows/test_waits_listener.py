"""get_event's wake-ups on PostgreSQL (journal/flows/event_listener.py): one LISTEN session per process
and alias however many callers wait, each woken by its own execution's set_event only, and every caller
served when the session is killed under it. Real threads, real commits, the real server.

(SQLite polls; tests/flows/test_waits_engine.py covers get_event there.)"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, connections

from journal.flows import event_listener, get_event, send, start, wake_due
from journal.flows import ownership as own
from journal.models import Execution
from tests.fixtures import waits_flows  # noqa: F401  (registers waits.reply)

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

WAITERS = 64  # callers waiting at once: 64 HTTP requests, say (the server allows max_connections=100)
TIMEOUT = 120.0  # get_event's timeout: a bound for a broken build, never reached by a passing one


@pytest.fixture(autouse=True)
def _flows(settings, effects):
    settings.LOOM_FLOW_MODULES = ["tests.fixtures.waits_flows"]
    settings.LOOM_SNAPSHOT_EVERY = None
    settings.LOOM_WAIT_INLINE_MAX = 0.0
    # Long polls: a waiter that gets its value before its first re-read was woken by a notification.
    settings.LOOM_WAIT_POLL = 5.0
    installed = own.get_ownership()
    own.set_ownership(None)  # as tests/flows/test_waits_engine.py: no lease keeper thread outlives the test
    yield
    own.set_ownership(installed)


def sessions(query_prefix: str) -> list[int]:
    """The pids of this database's sessions whose current or last statement starts with `query_prefix`."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                       "AND pid <> pg_backend_pid() AND query LIKE %s", [query_prefix + "%"])
        return [row[0] for row in cursor.fetchall()]


def until(condition, limit: float = 60.0, what: str = "the condition") -> None:
    """Wait until `condition()` holds (a bound, not a timing claim)."""
    give_up = time.monotonic() + limit
    while not condition():
        if time.monotonic() > give_up:
            raise AssertionError(f"{what} did not hold within {limit} s")
        time.sleep(0.05)


def park_replies(ids: list[str]) -> None:
    """Each execution waits for a message `next`, then publishes {"got": it} as its event `reply`."""
    for eid in ids:
        start("waits.reply", {}, execution_id=eid)
    assert set(Execution.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"waiting"}


def reply_to(ids: list[str]) -> None:
    """Send each its message and run the woken flows here (their set_event notifies on commit)."""
    for n, eid in enumerate(ids):
        send(eid, "next", n)
    done = 0
    give_up = time.monotonic() + 120
    while done < len(ids) and time.monotonic() < give_up:
        wake_due()
        done = Execution.objects.filter(pk__in=ids, status="completed").count()


class Callers:
    """One thread per execution, each in get_event(eid, "reply") until its value comes."""

    def __init__(self, ids: list[str]):
        self.results: dict[str, object] = {}
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._wait, args=(eid,), name=f"caller-{eid}") for eid in ids]
        for thread in self.threads:
            thread.start()

    def _wait(self, eid: str) -> None:
        try:
            self.results[eid] = get_event(eid, "reply", timeout=TIMEOUT, default="unset")
        except BaseException as exc:
            self.errors.append(exc)
        finally:
            connections.close_all()

    def join(self) -> dict[str, object]:
        for thread in self.threads:
            thread.join(TIMEOUT + 30)
        assert not self.errors, self.errors
        return self.results


def run_in_thread(target, *args) -> None:
    def body():
        try:
            target(*args)
        finally:
            connections.close_all()

    thread = threading.Thread(target=body)
    thread.start()
    thread.join(300)


def test_64_waiting_callers_share_one_listen_session_and_each_gets_its_own_value():
    ids = [f"wl-{n:02d}" for n in range(WAITERS)]
    park_replies(ids)
    callers = Callers(ids)
    # Every caller has read its value once (its connection's last statement), so each is waiting now;
    # then the LISTEN sessions are sampled while they all wait (a build with a session per caller shows
    # more than one within a few samples; one with the shared session shows exactly one).
    until(lambda: len(sessions("SELECT value FROM journal_flowevent")) >= WAITERS, what="every caller reading")
    seen: list[int] = []
    give_up = time.monotonic() + 30
    while time.monotonic() < give_up and (len(seen) < 20 or 1 not in seen) and max(seen, default=0) <= 1:
        seen.append(len(sessions("LISTEN")))
        time.sleep(0.05)
    assert not callers.results  # nothing was set yet: nobody returned
    run_in_thread(reply_to, ids)  # another thread sets the 64 events
    assert callers.join() == {eid: {"got": n} for n, eid in enumerate(ids)}
    assert max(seen) == 1, f"LISTEN sessions of this database while {WAITERS} callers waited: {seen}"


def test_a_notification_for_another_execution_leaves_a_waiter_waiting_until_its_own():
    park_replies(["wl-a", "wl-b"])
    listener = event_listener.listener_for(connection.alias)
    a, b = listener.waiter("wl-a"), listener.waiter("wl-b")
    try:
        until(lambda: listener.connected, what="the listener connected")
        a.woken.clear()
        b.woken.clear()
        callers = Callers(["wl-a", "wl-b"])
        until(lambda: listener.waiting() == 4, what="both callers subscribed")
        run_in_thread(reply_to, ["wl-b"])
        assert b.wait(TIMEOUT)  # woken by wl-b's notification ...
        assert not a.woken.is_set()  # ... which did not wake wl-a's waiters
        until(lambda: "wl-b" in callers.results, what="wl-b's caller served")
        assert "wl-a" not in callers.results  # still waiting: its value is not set
        assert get_event("wl-a", "reply", default="unset") == "unset"
        run_in_thread(reply_to, ["wl-a"])
        assert callers.join() == {"wl-a": {"got": 0}, "wl-b": {"got": 0}}
    finally:
        a.close()
        b.close()


def test_callers_get_their_values_when_the_listen_session_is_terminated_under_them():
    ids = [f"wl-t{n}" for n in range(8)]
    park_replies(ids)
    listener = event_listener.listener_for(connection.alias)
    callers = Callers(ids)
    until(lambda: listener.waiting() == len(ids) and listener.connected, what="the callers subscribed")
    until(lambda: len(sessions("LISTEN")) == 1, what="the LISTEN session on the server")
    [killed] = sessions("LISTEN")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [killed])
    # The events are set at once: their notifications may go to nobody (the session is gone); the
    # reconnect wakes every waiter to re-read (or their polls would find the values).
    run_in_thread(reply_to, ids)
    assert callers.join() == {eid: {"got": n} for n, eid in enumerate(ids)}
    until(lambda: sessions("LISTEN") not in ([], [killed]), what="a new LISTEN session")


def test_the_listen_session_closes_when_nobody_waits_and_opens_again_for_the_next_caller(monkeypatch):
    monkeypatch.setattr(event_listener, "IDLE_SECONDS", 0.2)
    park_replies(["wl-i"])
    assert get_event("wl-i", "reply", timeout=0.3, default="unset") == "unset"
    until(lambda: not sessions("LISTEN"), what="the idle session closed")
    callers = Callers(["wl-i"])
    listener = event_listener.listener_for(connection.alias)
    until(lambda: listener.waiting() == 1 and listener.connected, what="a new session for the next caller")
    run_in_thread(reply_to, ["wl-i"])
    assert callers.join() == {"wl-i": {"got": 0}}


def test_a_continue_as_new_wakes_the_waiters_of_the_run_that_continued():
    """They follow the chain now (their events were carried to the next run), not at their next poll."""
    start("waits.accumulator", 0, execution_id="wl-acc")
    listener = event_listener.listener_for(connection.alias)
    waiter = listener.waiter("wl-acc")
    try:
        until(lambda: listener.connected, what="the listener connected")
        waiter.woken.clear()

        def add_one() -> None:
            send("wl-acc", "add", 1)
            until(lambda: (wake_due(), Execution.objects.filter(pk="wl-acc~1").exists())[1], what="the next run")

        run_in_thread(add_one)
        assert waiter.wait(30)  # a bound: only the carry's notification wakes it (no event is set)
        assert Execution.objects.get(pk="wl-acc").status == "completed"
    finally:
        waiter.close()
