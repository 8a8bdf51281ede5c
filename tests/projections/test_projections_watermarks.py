"""Watermarks never pass an event that was not delivered (issue 11: "a projection silently skips events").

Several consumers in one lane follow the same stream with different watermarks; each must read from
its own. The in-process cases run on SQLite and PostgreSQL; the process case (producers, a consumer
SIGKILLed and restarted, checked with SQL) needs PostgreSQL.
"""

from __future__ import annotations

import signal
import time

import pytest
from django.db import connection

from journal.envelopes import Envelope
from journal.models import Event
from projections.declarations import reaction, registry
from projections.models import Subscription
from projections.service import drain
from projections.store import store_for
from tests.conftest import spawn_child
from tests.projections.test_projections_helpers import TABLE, applied, create_table, declare_counter, write

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def clean_registry():
    registry.clear()
    create_table()
    yield
    registry.clear()


def ticks(stream: str, n: int, noise: int = 0) -> None:
    Event.objects.append(stream, [Envelope("Tick", {"i": i}) for i in range(n)] + [Envelope("Noise")] * noise)


def declare_loose(name: str) -> None:
    """A non-atomic reaction (acked at the end of the cycle) that records what it was given."""
    reaction(name, on=["Tick"], atomic=False)(lambda event, target: write(name, event, target))


@pytest.mark.parametrize("kind", ["projection", "non-atomic reaction"])
def test_a_consumer_ahead_of_another_on_the_same_stream_gets_every_event(settings, kind):
    """The consumer ahead used to be acked to the tip from a read that started at the one behind."""
    settings.LOOM_DRAIN_BATCH = 5
    declare = declare_counter if kind == "projection" else declare_loose
    declare("ahead")
    ticks("s", 12, noise=1)
    drain()
    assert len(applied("ahead")) == 12
    declare("behind")  # a new consumer: it starts from the beginning of the log, 13 events behind
    ticks("s", 3)
    drain()
    expected = [("s", i) for i in range(12)] + [("s", i) for i in range(13, 16)]
    assert applied("ahead") == expected  # each event once: nothing skipped, nothing doubled
    assert applied("behind") == expected
    rows = {s.consumer: s for s in Subscription.objects.filter(stream="s")}
    assert (rows["ahead"].at, rows["behind"].at) == (15, 15)


def test_three_consumers_at_three_watermarks_each_read_from_their_own(settings):
    settings.LOOM_DRAIN_BATCH = 4
    settings.LOOM_DRAIN_STREAMS = 10
    declare_counter("first")
    ticks("s", 9)
    drain()
    declare_counter("second")
    ticks("s", 9)
    drain("default", max_cycles=1)  # first catches up; second has read one batch of 4
    declare_counter("third")
    ticks("s", 2)
    drain()
    for name in ("first", "second", "third"):
        assert applied(name) == [("s", i) for i in range(20)], name


def test_a_tip_no_event_backs_is_brought_down_and_never_acked(settings):
    """A subscription whose tip is beyond the stream (a forged notification's) delivers what exists,
    is acked only to the last event read, and is caught up again; later events still arrive."""
    declare_counter()
    ticks("s", 2)
    drain()
    Subscription.objects.filter(consumer="counter", stream="s").update(tip=999_999_999)
    ticks("s", 1)
    drain()
    row = Subscription.objects.get(consumer="counter", stream="s")
    assert (row.at, row.tip) == (2, 2)
    assert drain().claimed == 0  # no longer claimable: no busy loop on a tip that does not exist
    ticks("s", 2)
    drain()
    assert applied("counter") == [("s", i) for i in range(5)]


def test_a_claim_read_to_the_end_keeps_a_tip_raised_after_the_claim():
    """Bringing a tip down is conditional: a bump that came in after the claim stays."""
    declare_counter()
    ticks("s", 2)
    from projections.correlate import correlate

    correlate(registry)
    store = store_for()
    [claim] = store.claim("default", ["counter"], "w", 10, 30.0)
    events = store.read([claim], 100)[claim.id]
    assert [e.seq for e in events] == [0, 1]
    ticks("s", 1)
    correlate(registry)  # raises the tip to 2 while the claim is held
    assert store.ack([(claim, 1)], "w", ended={claim.id}) == {claim.id}
    row = Subscription.objects.get(pk=claim.id)
    assert (row.at, row.tip) == (1, 2)  # still has work


# -- real processes ------------------------------------------------------------------------------

CONSUMER = """
import os, sys, time
from tests.projections.test_projections_helpers import declare_counter
for name in {names!r}:
    declare_counter(name)
from projections.service import DrainService
class Node: worker_id = {wid!r}
service = DrainService()
service.start(Node())
while not os.path.exists({stop!r}):
    time.sleep(0.05)
service.stop(10)
"""

PRODUCER = """
from tests.projections.test_projections_helpers import produce
print(produce({prefix!r}, {streams}, {rounds}))
"""


def _eventually(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _counts() -> dict[str, tuple[int, int]]:
    """Per consumer, in SQL: rows applied, and (stream, seq) pairs applied more than once."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT consumer, count(*), count(*) - count(DISTINCT (stream, seq)) FROM {TABLE}"
                       " GROUP BY consumer")
        return {row[0]: (row[1], row[2]) for row in cursor.fetchall()}


def _ticks_in_journal() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM journal_event WHERE type = 'Tick'")
        return cursor.fetchone()[0]


@pytest.mark.postgres
def test_two_projections_far_apart_under_producers_and_a_killed_consumer(child_env, tmp_path):
    """Producers append while one projection is far ahead of another on the same streams; the
    consumer process is SIGKILLed and restarted. Each projection ends with exactly one row per Tick."""
    env = dict(child_env, LOOM_DRAIN_LEASE_SECONDS="1", LOOM_DRAIN_POLL_MS="50", LOOM_DRAIN_BATCH="7",
               LOOM_DRAIN_STREAMS="6", LOOM_CORRELATE_HORIZON_SECONDS="0.5")
    stop = tmp_path / "stop"
    # Phase 1: only "ahead" exists; it follows 4 streams to their tips.
    first = spawn_child(CONSUMER.format(names=["ahead"], wid="c1", stop=str(stop)), env)
    producers = [spawn_child(PRODUCER.format(prefix=f"p{i}-", streams=4, rounds=30), env) for i in range(2)]
    consumers = [first]
    try:
        for p in producers:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
        _eventually(lambda: _counts().get("ahead", (0, 0))[0] >= _ticks_in_journal(), 120, "ahead caught up")
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=30)
        # Phase 2: "behind" joins (every stream 30+ events behind, the batch is 7) while producers go
        # on; the consumer is killed mid-way and restarted.
        second = spawn_child(CONSUMER.format(names=["ahead", "behind"], wid="c2", stop=str(stop)), env)
        consumers.append(second)
        producers = [spawn_child(PRODUCER.format(prefix=f"p{i}-", streams=4, rounds=30), env) for i in range(2)]
        _eventually(lambda: _counts().get("behind", (0, 0))[0] > 20, 120, "behind to start")
        second.send_signal(signal.SIGKILL)
        second.communicate(timeout=30)
        third = spawn_child(CONSUMER.format(names=["ahead", "behind"], wid="c3", stop=str(stop)), env)
        consumers.append(third)
        for p in producers:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
        total = _ticks_in_journal()
        assert total == 4 * 4 * 30
        _eventually(lambda: all(_counts().get(n, (0, 0))[0] >= total for n in ("ahead", "behind")), 180,
                    "both projections to apply every Tick")
        # Let the drains settle, then check: nothing lost, nothing doubled, every watermark at its tip.
        _eventually(lambda: not Subscription.objects.filter(leased_by__isnull=False).exists(), 30, "idle")
    finally:
        stop.touch()
        errors = [c.communicate(timeout=60)[1] for c in consumers if c.returncode is None]
    assert consumers[-1].returncode == 0, errors
    counts = _counts()
    assert counts["ahead"] == (total, 0) and counts["behind"] == (total, 0)
    with connection.cursor() as cursor:
        cursor.execute("SELECT s.consumer, s.stream, s.at, (SELECT max(seq) FROM journal_event j"
                       " WHERE j.stream_id = s.stream) FROM projections_subscription s WHERE s.at <> (SELECT"
                       " max(seq) FROM journal_event j WHERE j.stream_id = s.stream)")
        assert cursor.fetchall() == []


def test_a_failure_while_redoing_the_events_before_a_poison_one_keeps_the_watermark(settings):
    """Atomic consumer: the events before a failing one are redone in a transaction with the failure.
    If that redo fails too, everything rolled back: the watermark must stay where it was."""
    settings.LOOM_DRAIN_RETRY_DELAY = 0.0
    calls = {"n": 0, "flaky": True}

    def handle(event, target):
        calls["n"] += 1
        if calls["flaky"] and (event.seq == 2 or calls["n"] > 3):  # seq 2 fails, then the redo of seq 0 fails
            raise ValueError(f"flaky on {event.seq}")
        write("flaky", event, target)

    from projections.declarations import projection

    projection("flaky", on=["Tick"], handler=handle)
    ticks("s", 4)
    drain("default", max_cycles=1)
    row = Subscription.objects.get(consumer="flaky")
    assert (row.at, row.retries) == (-1, 1) and applied("flaky") == []
    calls["flaky"] = False
    drain()
    assert applied("flaky") == [("s", i) for i in range(4)]


# -- correlation: a gap settles only once the transactions that could hold it have ended ----------

def test_an_aged_gap_waits_for_the_transactions_running_when_it_aged():
    from datetime import UTC, datetime, timedelta

    from projections.correlate import settle
    from projections.store.base import CheckpointRow

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    held = settle(CheckpointRow("c", 10, 10, None), [11, 13, 14], t0, 2.0, xmax=500, oldest=490)
    assert (held.position, held.horizon_id, held.horizon_xmax) == (11, 14, None)
    later = t0 + timedelta(seconds=3)
    aged = settle(held, [13, 14], later, 2.0, xmax=520, oldest=495)  # aged by time: remember xmax 520
    assert (aged.position, aged.horizon_xmax) == (11, 520)
    assert settle(aged, [13, 14], later, 2.0, xmax=530, oldest=519).position == 11  # xid 519 still runs
    assert settle(aged, [12, 13, 14], later, 2.0, xmax=530, oldest=519).position == 14  # it committed: seen
    assert settle(aged, [13, 14], later, 2.0, xmax=530, oldest=520).position == 14  # all ended: rolled back


@pytest.mark.postgres
def test_an_event_committed_long_after_the_horizon_is_still_correlated(settings):
    """A writer holds an event uncommitted well past the horizon while later ids commit; no
    notification is listened to (drain() has no listener): the scan alone must still find it."""
    import threading

    from django.db import connections, transaction

    from projections.correlate import correlate
    from projections.models import Checkpoint

    settings.LOOM_CORRELATE_HORIZON_SECONDS = 0.1
    declare_counter()
    inserted, release = threading.Event(), threading.Event()

    def slow_writer():
        try:
            with transaction.atomic():
                Event.objects.append("slow", Envelope("Tick"))
                inserted.set()
                release.wait(60)
        finally:
            connections.close_all()

    writer = threading.Thread(target=slow_writer)
    writer.start()
    try:
        assert inserted.wait(30)
        ticks("fast", 1)  # a higher id, committed: the slow one is a gap in the ids
        for _ in range(6):
            correlate(registry)
            time.sleep(0.1)  # five times the horizon in all
        assert Checkpoint.objects.get(consumer="counter").position < Event.objects.get(stream_id="fast").id
    finally:
        release.set()
        writer.join(30)
    drain()
    assert applied("counter") == [("fast", 0), ("slow", 0)]
