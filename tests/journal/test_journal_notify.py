"""The journal's NOTIFY on PostgreSQL: one notification per statement, with every stream tip."""

from __future__ import annotations

import json

import psycopg
import pytest
from django.db import connection

from journal.envelopes import AppendItem, Envelope
from journal.exceptions import StaleFence
from journal.models import Event, Fence

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def listener():
    s = connection.settings_dict
    conn = psycopg.connect(host=s["HOST"] or "127.0.0.1", port=s["PORT"] or 5432, dbname=s["NAME"],
                           user=s["USER"] or None, password=s["PASSWORD"] or None, autocommit=True)
    conn.execute("LISTEN loom_journal")
    yield conn
    conn.close()


def received(conn, expected: int, timeout: float = 2.0) -> list[dict]:
    """Notifications until `expected` arrived or `timeout` passed (a bound, not an assertion)."""
    return [json.loads(n.payload) for n in conn.notifies(timeout=timeout, stop_after=expected)]


def test_append_notifies_the_new_tip(listener):
    Event.objects.append("a", [Envelope("One"), Envelope("Two")])
    assert received(listener, 1) == [{"tips": {"a": 1}, "types": ["One", "Two"]}]


def test_batch_sends_one_notification_with_every_tip(listener):
    Event.objects.open_stream("x", Envelope("Started"))
    Event.objects.append_batch([
        AppendItem.build("x", [Envelope("S"), Envelope("S")], 1),
        AppendItem.build("y", Envelope("T")),
        AppendItem.build("z", [Envelope("U"), Envelope("T"), Envelope("U")]),
    ])
    notes = received(listener, 3)
    assert notes[0] == {"tips": {"x": 0}, "types": ["Started"]}
    assert notes[1:] == [{"tips": {"x": 2, "y": 0, "z": 2}, "types": ["S", "T", "U"]}]


def test_refused_append_notifies_nothing(listener):
    Event.objects.open_stream("x", Envelope("Started"))
    Fence.objects.advance("x")
    with pytest.raises(StaleFence):
        Event.objects.append("x", Envelope("Late"), fence_token=1)
    assert received(listener, 2, timeout=0.5) == [{"tips": {"x": 0}, "types": ["Started"]}]


def test_oversized_notification_falls_back_to_poll(listener):
    items = [AppendItem.build(f"stream-with-a-long-name-{i:04d}-" + "x" * 60, Envelope("E")) for i in range(120)]
    Event.objects.append_batch(items)
    assert received(listener, 1) == [{"poll": True}]
    assert Event.objects.count() == 120


def test_notify_can_be_switched_off(listener, settings):
    settings.LOOM_NOTIFY = False
    Event.objects.append("a", Envelope("Quiet"))
    assert received(listener, 1, timeout=0.5) == []
