"""Notifications are hints (issue 12): any role that can connect may NOTIFY the journal's channel.

A payload that is not a journal notification asks for a scan and never costs the listener its
connection; a forged tip is clamped to the stream's real last seq and a stream without events gets
no subscription. The store and handler cases run on both backends; LISTEN needs PostgreSQL.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
from django.db import connection

from journal.envelopes import Envelope
from journal.models import Event
from projections.correlate import parse_notification
from projections.declarations import registry
from projections.listener import Listener
from projections.models import Subscription
from projections.service import DrainService, drain
from projections.store import store_for
from tests.projections.test_projections_helpers import applied, create_table, declare_counter

pytestmark = pytest.mark.django_db(transaction=True)

HOSTILE = [
    "[1, 2, 3]", '"a string"', "42", "null", "true", "garbage{", "", "[" * 7000,
    '{"tips": [1], "types": ["Tick"]}',
    '{"tips": {}, "types": ["Tick"]}',
    '{"tips": {"real": "5"}, "types": ["Tick"]}',
    '{"tips": {"real": true}, "types": ["Tick"]}',
    '{"tips": {"real": -4}, "types": ["Tick"]}',
    '{"tips": {"real": 1.5}, "types": ["Tick"]}',
    '{"tips": {"real": 1e30}, "types": ["Tick"]}',
    '{"tips": {"real": 99999999999999999999999}, "types": ["Tick"]}',
    '{"tips": {"real": 3}, "types": "Tick"}',
    '{"tips": {"real": 3}, "types": [1]}',
    '{"tips": {"real": 3}}',
    '{"tips": {"\\ud800": 3}, "types": ["Tick"]}',
    '{"tips": {"a\\u0000b": 3}, "types": ["Tick"]}',
    json.dumps({"tips": {"x" * 201: 3}, "types": ["Tick"]}),
    '{"poll": "yes", "tips": {"real": 3}, "types": ["Tick"]}',
]
# Well-formed but lying: the tips are clamped when stored.
FORGED = [
    '{"tips": {"real": 999999999}, "types": ["Tick"]}',
    '{"tips": {"ghost": 999999999}, "types": ["Tick"]}',
    '{"tips": {"real": 999999999, "ghost": 5}, "types": ["Tick"]}',
]


@pytest.fixture(autouse=True)
def clean_registry():
    registry.clear()
    create_table()
    yield
    registry.clear()


def tips_beyond_the_stream() -> list[tuple]:
    """Subscriptions whose tip passes their stream's real last seq (or whose stream has no events)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT s.consumer, s.stream, s.tip FROM projections_subscription s WHERE s.tip >"
                       " COALESCE((SELECT max(j.seq) FROM journal_event j WHERE j.stream_id = s.stream), -1)")
        return cursor.fetchall()


def eventually(condition, timeout: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def test_only_well_formed_journal_notifications_are_parsed():
    for payload in HOSTILE:
        assert parse_notification(payload) is None, payload
    assert parse_notification('{"poll": true}') is None
    assert parse_notification('{"tips": {"a": 4, "b": 0}, "types": ["Tick"]}') == ({"a": 4, "b": 0},
                                                                                    frozenset({"Tick"}))


def test_hinted_bumps_are_clamped_to_the_real_tip_and_subscribe_no_empty_stream():
    declare_counter()
    Event.objects.append("real", [Envelope("Tick"), Envelope("Tick")])
    c = registry.consumers["counter"]
    row = (c.name, "real", c.source, c.lane, c.priority)
    store = store_for()
    store.bump([(*row, 999_999_999), (c.name, "ghost", c.source, c.lane, c.priority, 7)], hinted=True)
    assert {s.stream: s.tip for s in Subscription.objects.all()} == {"real": 1}
    store.bump([(*row, 0)], hinted=True)  # a lower hint changes nothing
    assert Subscription.objects.get(stream="real").tip == 1


def test_the_listener_handles_hostile_payloads_without_raising_and_stores_no_forged_tip():
    declare_counter()
    Event.objects.append("real", [Envelope("Tick"), Envelope("Tick")])
    woken, scans = [], []
    listener = Listener(registry, "default", woken.append, lambda: scans.append(True), threading.Event())
    listener.handle(HOSTILE)
    assert listener.rejected == len(HOSTILE) and scans  # each one asked for a scan instead
    listener.handle(FORGED)
    assert tips_beyond_the_stream() == []
    assert {s.stream: s.tip for s in Subscription.objects.all()} == {"real": 1}
    drain()
    assert applied() == [("real", 0), ("real", 1)]
    Event.objects.append("real", Envelope("Tick"))
    drain()
    assert applied() == [("real", 0), ("real", 1), ("real", 2)]


@pytest.mark.postgres
@pytest.mark.parametrize("channel", ["loom_journal", 'loom "quoted" channel'])
def test_hostile_notify_payloads_leave_the_listener_listening(settings, channel):
    """pg_notify from any session: garbage, non-objects, wrong types and forged tips. The listener
    keeps its one session, no subscription tip passes its stream's real tip, and real commits
    still wake the drain. A channel name with quotes is LISTENed to as an identifier."""
    settings.LOOM_NOTIFY_CHANNEL = channel
    settings.LOOM_DRAIN_POLL_MS = 200
    declare_counter()
    Event.objects.append("real", [Envelope("Tick"), Envelope("Tick")])
    service = DrainService()
    service.start()
    try:
        eventually(lambda: service.listener.ready.is_set(), what="LISTEN")
        eventually(lambda: len(applied()) == 2, what="the first events")
        with connection.cursor() as cursor:
            for payload in HOSTILE + FORGED:
                cursor.execute("SELECT pg_notify(%s, %s)", [channel, payload])
        eventually(lambda: service.listener.received >= len(HOSTILE) + len(FORGED), what="every payload")
        Event.objects.append("real", Envelope("Tick"))
        Event.objects.append("later", Envelope("Tick"))
        eventually(lambda: len(applied()) == 4, what="real commits after the hostile ones")
    finally:
        service.stop(10)
    assert service.listener.sessions == 1  # never dropped its connection
    assert service.listener.rejected == len(HOSTILE)
    assert tips_beyond_the_stream() == []
    assert not Subscription.objects.filter(stream="ghost").exists()
    assert applied() == [("later", 0), ("real", 0), ("real", 1), ("real", 2)]
