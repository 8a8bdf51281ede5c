"""Reactions and projections: claims, watermarks, fences, blocking, lanes, wake-ups, workers.

Store-level and in-process cases run on SQLite and PostgreSQL; the multi-process cases
(drain-under-churn, a SIGKILLed consumer) and the LISTEN wake-up need PostgreSQL.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from journal.envelopes import Envelope
from journal.models import Event
from projections.admin import reset_consumers
from projections.correlate import bumps_from_notification, correlate, settle
from projections.declarations import Consumer, projection, reaction, registry
from projections.drain import DrainController
from projections.exceptions import DeclarationError, LeaseLost
from projections.listener import Listener
from projections.models import Subscription
from projections.service import DrainService, drain
from projections.store import store_for
from projections.store.base import CheckpointRow
from tests.conftest import spawn_child
from tests.projections.test_projections_helpers import (
    applied,
    create_table,
    declare_counter,
    declare_failing,
    declare_lanes,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def clean_registry():
    registry.clear()
    create_table()
    yield
    registry.clear()


@pytest.fixture
def fast(settings):
    settings.LOOM_DRAIN_RETRY_DELAY = 0.0
    settings.LOOM_DRAIN_POLL_MS = 20
    settings.LOOM_CORRELATE_HORIZON_SECONDS = 0.2
    return settings


def eventually(condition, timeout: float = 60.0, what: str = "condition"):
    """Wait for a condition (a deadline for progress, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def ticks(stream: str, n: int, noise: int = 0) -> None:
    Event.objects.append(stream, [Envelope("Tick", {"i": i}) for i in range(n)] + [Envelope("Noise")] * noise)


def subs(consumer: str) -> dict[str, Subscription]:
    return {s.stream: s for s in Subscription.objects.filter(consumer=consumer)}


# -- delivery -----------------------------------------------------------------------------------

def test_projection_applies_every_followed_event_once_and_skips_other_types():
    declare_counter()
    ticks("a", 3, noise=2)
    ticks("b", 2)
    Event.objects.append("c", Envelope("Noise"))
    result = drain()
    assert applied() == [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1)]
    assert result.handled == 5
    rows = subs("counter")
    assert set(rows) == {"a", "b"}  # no subscription for a stream without followed events
    assert (rows["a"].at, rows["b"].at) == (4, 1)  # the watermark passes the Noise events too
    assert all(r.leased_by is None for r in rows.values())
    again = drain()
    assert (again.claimed, again.handled, len(applied())) == (0, 0, 5)


def test_source_prefix_limits_the_streams_followed():
    declare_counter(source="order-")
    ticks("order-1", 1)
    ticks("user-1", 1)
    drain()
    assert applied() == [("order-1", 0)]


def test_reaction_with_dynamic_target_appends_once_in_the_same_transaction():
    @reaction("invoice", on=["OrderPlaced"], target=lambda e: f"invoice-{e.payload['n']}")
    def invoice(event, target):
        Event.objects.append(target, Envelope("InvoiceDue", {"order": event.stream_id}))

    for n in range(3):
        Event.objects.append(f"order-{n}", Envelope("OrderPlaced", {"n": n}))
    drain()
    drain()
    for n in range(3):
        assert [e.type for e in Event.objects.read(f"invoice-{n}")] == ["InvoiceDue"]


def test_batch_handler_gets_the_claim_in_order_and_an_error_rolls_it_all_back(fast):
    calls: list[list[int]] = []
    state = {"fail": True}

    def batch(events, target):
        calls.append([e.seq for e in events])
        for e in events:
            from tests.projections.test_projections_helpers import write
            write("batched", e, target)
        if state["fail"]:
            raise RuntimeError("read model unavailable")

    fast.LOOM_DRAIN_RETRY_DELAY = 60.0  # one attempt per drain()
    projection("batched", on=["Tick"], batch=batch)
    ticks("s", 4)
    result = drain()
    assert result.failed == 1 and applied() == []
    assert subs("batched")["s"].at == -1  # the watermark did not move
    assert "read model unavailable" in subs("batched")["s"].error
    state["fail"] = False
    store_for().unblock([subs("batched")["s"].pk])  # also ends the back-off
    drain()
    assert applied() == [("s", 0), ("s", 1), ("s", 2), ("s", 3)]
    assert calls[-1] == [0, 1, 2, 3]
    assert subs("batched")["s"].retries == 0


def test_always_failing_handler_ends_blocked_with_its_error_and_others_go_on(fast):
    fast.LOOM_DRAIN_RETRIES = 3
    declare_failing(bad_stream="bad")
    ticks("bad", 2)
    ticks("good-1", 2)
    ticks("good-2", 1)
    for _ in range(5):
        drain()
    rows = subs("picky")
    assert rows["bad"].blocked and rows["bad"].retries == 3
    assert "ValueError: cannot project bad#0" in rows["bad"].error
    assert rows["bad"].at == -1
    assert [s for s, _ in applied()] == ["good-1", "good-1", "good-2"]
    ticks("good-1", 1)
    drain()
    assert len(applied()) == 4  # the blocked stream holds nobody back
    assert store_for().unblock([rows["bad"].pk]) == 1
    assert not Subscription.objects.get(pk=rows["bad"].pk).blocked


def test_events_before_a_failing_one_are_kept(fast):
    def handle(event, target):
        if event.seq == 2:
            raise ValueError("poison")
        from tests.projections.test_projections_helpers import write
        write("partial", event, target)

    fast.LOOM_DRAIN_RETRY_DELAY = 60.0
    projection("partial", on=["Tick"], handler=handle)
    ticks("s", 4)
    drain()
    assert applied() == [("s", 0), ("s", 1)]
    row = subs("partial")["s"]
    assert (row.at, row.retries) == (1, 1) and "poison" in row.error


# -- claims, watermarks and fences --------------------------------------------------------------

def test_caught_up_streams_are_not_claimed():
    declare_counter()
    for i in range(40):
        ticks(f"s{i}", 1)
    drain()
    ticks("s3", 1)
    ticks("s17", 2)
    correlate(registry)
    claims = store_for().claim("default", ["counter"], "probe", 100, 5.0)
    assert sorted(c.stream for c in claims) == ["s17", "s3"]
    assert store_for().claim("default", ["counter"], "other", 100, 5.0) == []  # live leases are not claimed


def test_ack_from_a_worker_whose_lease_was_taken_over_is_ignored():
    declare_counter()
    ticks("s", 2)
    correlate(registry)
    store = store_for()
    [old] = store.claim("default", ["counter"], "worker-a", 10, 0.05)
    time.sleep(0.1)  # let the lease expire
    [new] = store.claim("default", ["counter"], "worker-b", 10, 30.0)
    assert new.lease == old.lease + 1
    assert store.ack([(old, 1)], "worker-a") == set()
    assert subs("counter")["s"].at == -1
    # A projection run under the lost lease rolls its read-model writes back with the refused ack.
    controller = DrainController(registry, registry.lanes["default"], "worker-a")
    with pytest.raises(LeaseLost):
        controller._apply(store, registry.consumers["counter"], old, Event.objects.read("s"), 1)
    assert applied() == []
    assert store.ack([(new, 1)], "worker-b") == {new.id}
    assert subs("counter")["s"].at == 1


def test_an_expired_lease_cannot_ack_even_if_nobody_took_it():
    declare_counter()
    ticks("s", 1)
    correlate(registry)
    store = store_for()
    [claim] = store.claim("default", ["counter"], "worker-a", 10, 0.05)
    time.sleep(0.1)
    assert store.ack([(claim, 0)], "worker-a") == set()


def test_reset_replays_a_projection_from_the_start():
    wiped = []

    def reset():
        wiped.append(True)
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM proj_applied")

    declare_counter(reset=reset)
    ticks("a", 2)
    drain()
    assert reset_consumers({"counter"}) == 1 and wiped == [True]
    assert applied() == [] and subs("counter")["a"].at == -1
    drain()
    assert applied() == [("a", 0), ("a", 1)]


def test_a_replay_over_a_compacted_stream_is_warned_and_sees_the_kept_events(caplog):
    """A stream whose first events were compacted away (journal/compaction.py deletes them the same way: the
    rows before seq 3) replays from seq 3: the drain says so, naming the projection and the stream."""
    declare_counter()
    ticks("a", 5)
    drain()
    reset_consumers({"counter"})
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM proj_applied")
        cursor.execute("DELETE FROM journal_event WHERE stream_id = 'a' AND seq < 3")
    with caplog.at_level("WARNING", logger="loom.projections"):
        drain()
    assert applied() == [("a", 3), ("a", 4)]
    assert any("projection counter reads a from seq 3, not 0" in r.getMessage() for r in caplog.records)


def test_declarations_refuse_what_cannot_work():
    declare_counter()
    with pytest.raises(DeclarationError, match="already declared"):
        declare_counter()
    with pytest.raises(DeclarationError, match="static target"):
        registry.add(Consumer("x", frozenset({"A"}), batch=lambda e, t: None, target=lambda e: "t"))
    with pytest.raises(DeclarationError, match="no event types"):
        projection("z", on=[], handler=lambda e, t: None)


# -- correlation ---------------------------------------------------------------------------------

def test_checkpoint_waits_at_a_gap_until_the_horizon_has_passed():
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    start = CheckpointRow("c", 10, 10, None)
    assert settle(start, [11, 12, 13], t0, 2.0) == CheckpointRow("c", 13, 13, None)
    held = settle(start, [11, 13, 14], t0, 2.0)  # 12 missing: maybe not committed yet
    assert (held.position, held.horizon_id, held.horizon_at) == (11, 14, t0)
    assert settle(held, [13, 14, 15], t0 + timedelta(seconds=1), 2.0).position == 11
    late = settle(held, [12, 13, 14, 15], t0 + timedelta(seconds=1), 2.0)  # 12 committed late: not skipped
    assert late.position == 15
    gone = settle(held, [13, 14, 15], t0 + timedelta(seconds=3), 2.0)  # 12 rolled back
    assert gone == CheckpointRow("c", 15, 15, None)


def test_a_new_consumer_catches_up_on_history():
    ticks("a", 2)
    declare_counter()
    drain()
    projection("late", on=["Tick"], handler=lambda e, t: None)
    ticks("b", 1)
    drain()
    assert set(subs("late")) == {"a", "b"}
    assert subs("late")["a"].at == 1


def test_notification_payloads_route_exactly_or_ask_for_a_scan():
    declare_counter()
    bumps, scan = bumps_from_notification(registry, '{"tips": {"a": 4}, "types": ["Tick", "Noise"]}')
    assert [(b[0], b[1], b[5]) for b in bumps] == [("counter", "a", 4)] and not scan
    bumps, scan = bumps_from_notification(registry, '{"tips": {"a": 4, "b": 1}, "types": ["Tick", "Noise"]}')
    assert bumps == [] and scan  # which stream got the Tick is unknown: scan
    bumps, scan = bumps_from_notification(registry, '{"tips": {"a": 4, "b": 1}, "types": ["Noise"]}')
    assert bumps == [] and not scan  # nothing followed: drain skip
    assert bumps_from_notification(registry, '{"poll": true}') == ([], True)


def test_non_reactive_notifications_cause_no_queries_and_wake_nothing():
    declare_counter()
    ticks("x", 4)  # a notification's tip is a hint: it is clamped to the stream's real last seq (3)
    woken: list[set] = []
    scans: list[bool] = []
    listener = Listener(registry, "default", woken.append, lambda: scans.append(True), threading.Event())
    with CaptureQueriesContext(connection) as queries:
        listener.handle(['{"tips": {"x": 3}, "types": ["Noise"]}', '{"tips": {"y": 0, "z": 1}, "types": ["Other"]}'])
    assert len(queries) == 0 and woken == [] and scans == []
    listener.handle(['{"tips": {"x": 3}, "types": ["Tick"]}'])
    assert woken == [{"default"}] and subs("counter")["x"].tip == 3


# -- background service --------------------------------------------------------------------------

def test_slow_lane_does_not_stop_fast_lane_from_acking(fast):
    release, started = threading.Event(), threading.Event()
    declare_lanes(release, started)
    service = DrainService()
    service.start()
    try:
        Event.objects.append("slow-1", Envelope("Slow"))
        eventually(started.is_set, what="the slow handler to start")
        for i in range(10):
            Event.objects.append(f"fast-{i}", [Envelope("Fast"), Envelope("Fast")])
        eventually(lambda: len(applied("fast-counter")) == 20, what="the fast lane to apply its events")
        fast_rows = subs("fast-counter")
        assert all(s.at == 1 and s.leased_by is None for s in fast_rows.values())
        assert subs("slow-hook")["slow-1"].at == -1  # still waiting in its handler
    finally:
        release.set()
        service.stop(10)
    assert service.lanes["slow"].result.handled == 1


@pytest.mark.postgres
def test_listen_wakes_only_on_followed_types(settings):
    settings.LOOM_DRAIN_POLL_MS = 60_000  # no polling: only notifications can wake the lane
    declare_counter()
    service = DrainService()
    service.start()
    try:
        eventually(lambda: service.listener.ready.is_set(), what="LISTEN")
        lane = service.lanes["default"]
        eventually(lambda: lane.wake.is_set() is False and lane.cycles >= 1, what="the first cycle")
        time.sleep(0.2)  # let the start-up scan's wake-up settle
        before = lane.cycles
        for i in range(20):
            Event.objects.append(f"n{i}", Envelope("Noise"))
        eventually(lambda: service.listener.received >= 20, what="20 notifications")
        assert lane.cycles == before  # non-reactive commits: no claim, no read, no ack
        Event.objects.append("t", Envelope("Tick"))
        eventually(lambda: applied() == [("t", 0)], what="the Tick to be applied")
    finally:
        service.stop(10)


# -- several processes ---------------------------------------------------------------------------

CONSUMER = """
import os, time
from tests.projections.test_projections_helpers import declare_counter
declare_counter(delay={delay})
from projections.service import DrainService
class Node: worker_id = {wid!r}
service = DrainService()
service.start(Node())
while not os.path.exists({stop!r}):
    time.sleep(0.05)
service.stop(10)
print(service.handled)
"""

PRODUCER = """
from tests.projections.test_projections_helpers import produce
print(produce({prefix!r}, {streams}, {rounds}))
"""


def _no_stale_leases() -> int:
    return Subscription.objects.exclude(leased_by=None).count()


@pytest.mark.postgres
def test_drain_under_churn_handles_every_event_exactly_once(child_env, tmp_path):
    """4 consumer processes drain while 4 producer processes commit."""
    env = dict(child_env, LOOM_DRAIN_LEASE_SECONDS="2", LOOM_DRAIN_POLL_MS="100", LOOM_DRAIN_STREAMS="4",
               LOOM_DRAIN_BATCH="7", LOOM_CORRELATE_HORIZON_SECONDS="0.5")
    stop = tmp_path / "stop"
    consumers = [spawn_child(CONSUMER.format(delay=0, wid=f"c{i}", stop=str(stop)), env) for i in range(4)]
    producers = [spawn_child(PRODUCER.format(prefix=f"p{i}-", streams=6, rounds=25), env) for i in range(4)]
    try:
        written = 0
        for p in producers:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
            written += int(out.strip())
        assert written == 4 * 6 * 25
        declare_counter()
        eventually(lambda: len(applied()) >= written, timeout=120, what="every Tick applied")
    finally:
        stop.touch()
        outputs = [c.communicate(timeout=60) for c in consumers]
    assert all(c.returncode == 0 for c in consumers), [o[1][-2000:] for o in outputs]
    rows = applied()
    assert len(rows) == written and len(set(rows)) == written  # each event exactly once
    assert sum(int(o[0].strip()) for o in outputs) == written
    assert sum(1 for o in outputs if int(o[0].strip()) > 0) >= 2  # the work was shared
    subscriptions = Subscription.objects.filter(consumer="counter")
    assert subscriptions.count() == 24 and all(s.at >= s.tip for s in subscriptions)
    assert _no_stale_leases() == 0  # every lease was released, none outlived its holder


@pytest.mark.postgres
def test_consumer_killed_mid_batch_loses_nothing_and_applies_nothing_twice(child_env, tmp_path):
    env = dict(child_env, LOOM_DRAIN_LEASE_SECONDS="1", LOOM_DRAIN_POLL_MS="50", LOOM_DRAIN_BATCH="50")
    declare_counter()
    for i in range(4):
        ticks(f"k{i}", 20)
    stop = tmp_path / "stop"
    victim = spawn_child(CONSUMER.format(delay=0.05, wid="victim", stop=str(stop)), env)
    try:
        eventually(lambda: Subscription.objects.filter(leased_by="victim").exists(), what="the victim's claim")
        time.sleep(0.3)  # it is inside a batch (50 ms per event, 20 events a stream)
        victim.send_signal(signal.SIGKILL)
        victim.communicate(timeout=30)
        assert victim.returncode == -signal.SIGKILL
        survivor = spawn_child(CONSUMER.format(delay=0, wid="survivor", stop=str(stop)), env)
        eventually(lambda: len(applied()) >= 80, what="the survivor to finish")
    finally:
        stop.touch()
    _, err = survivor.communicate(timeout=60)
    assert survivor.returncode == 0, err
    rows = applied()
    assert len(rows) == 80 and len(set(rows)) == 80
    assert all(s.at == 19 for s in Subscription.objects.filter(consumer="counter"))
    assert _no_stale_leases() == 0
    assert os.path.exists(stop)
