"""The index rebuild of the retention service (journal/reindex.py, docs/backends.md "Index sizes under removal"):
journal_event's indexes, bloated by removal, are rebuilt with REINDEX INDEX CONCURRENTLY once they pass
LOOM_REINDEX_RATIO times the heap, one at a time and outside any transaction, while appends go on; one rebuilder
per database (a second one returns at once); the invalid copy an interrupted rebuild leaves is dropped; off by
default, and nothing on SQLite."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections
from django.test import override_settings
from django.utils import timezone

from journal import reindex, retention
from journal.envelopes import Envelope
from journal.models import Event
from journal.store import retention_store_for
from leases.retention import RetentionService

FLOW = "bench.growth.settled"


def test_off_by_default_and_nothing_on_sqlite_or_inside_a_transaction(db):
    assert reindex.run("default").skipped == "LOOM_REINDEX_RATIO is not set"
    if connection.vendor == "sqlite":
        assert "not PostgreSQL" in reindex.run("default", ratio=1.0).skipped
    else:
        with pytest.raises(RuntimeError, match="outside any transaction"):
            reindex.run("default", ratio=1.0)  # the test's own transaction


def test_the_retention_service_looks_at_the_indexes_once_per_period(monkeypatch, db):
    calls = []
    monkeypatch.setattr(reindex, "run", lambda alias: calls.append(alias))
    service = RetentionService()
    service._reindex("default")
    assert calls == []  # LOOM_REINDEX_RATIO unset: never
    with override_settings(LOOM_REINDEX_RATIO=1.5, LOOM_REINDEX_EVERY=3600):
        service._reindex("default")
        service._reindex("default")
    assert calls == ["default"]


def _bloat(store, count: int = 3000) -> None:
    """Settled executions (10 events each) over 400 days; removal of those past 30 days; VACUUM."""
    store.fill_settled("rx_", 0, count, 10, '{"data": "filled"}', 400.0, FLOW)
    with override_settings(LOOM_RETENTION_DAYS=None, LOOM_RETENTION_FLOWS=[f"{FLOW}=30"], LOOM_RETENTION_BATCH=500,
                           LOOM_ARCHIVE_FLOWS=[]):
        assert retention.run("default", now=timezone.now())["executions"] > count * 0.9
    store.vacuum()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_bloated_event_indexes_are_rebuilt_smaller_while_an_appender_goes_on():
    store = retention_store_for("default")
    _bloat(store)
    before = {index: size for _, index, size, _ in store.index_sizes()}
    assert set(before) >= {"journal_event_pkey", "journal_event_stream_seq"}
    assert reindex.run("default", ratio=1000.0).rebuilt == []  # under the ratio: nothing rebuilt
    stop, errors, tips = threading.Event(), [], []

    def appender() -> None:
        try:
            while not stop.is_set():
                tips.append(Event.objects.append("rx-probe", [Envelope("Probe", {"n": len(tips)})]).last_seq)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=appender)
    thread.start()
    try:
        done = reindex.run("default", ratio=0.5)
    finally:
        stop.set()
        thread.join(60)
    assert errors == [] and tips == list(range(len(tips))) and tips  # every append went through, in order
    assert [r["index"] for r in done.rebuilt] == sorted(before)  # one at a time, each index of journal_event
    after = {index: size for _, index, size, _ in store.index_sizes()}
    assert all(after[index] < before[index] for index in before), (before, after)
    assert [e.seq for e in Event.objects.read("rx-probe")] == tips


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_one_rebuilder_at_a_time_and_an_interrupted_rebuilds_copy_is_dropped():
    holder = connections.create_connection("default")  # another process's rebuilder, holding the session lock
    with holder.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(1282371437, 3)")
    try:
        assert reindex.run("default", ratio=0.01).skipped == "another process rebuilds this shard's indexes"
    finally:
        holder.close()  # its session ends: the server releases the lock
    Event.objects.append("rx-dup", [Envelope("Same", {}), Envelope("Same", {})])
    # a failed concurrent build leaves an invalid index behind
    with connection.cursor() as cursor, pytest.raises(Exception, match="could not create unique index"):
        cursor.execute("CREATE UNIQUE INDEX CONCURRENTLY journal_event_type_ccnew ON journal_event (type)")
    store = retention_store_for("default")
    assert store.leftover_rebuilds() == ["journal_event_type_ccnew"]
    done = reindex.run("default", ratio=1000.0)
    assert done.dropped == ["journal_event_type_ccnew"] and store.leftover_rebuilds() == []
