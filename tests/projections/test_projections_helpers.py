"""Declarations and a read-model table shared by the projection tests and their child processes.

The read model is a plain table made with raw SQL (no test app in INSTALLED_APPS): one row per
application of an event, so "applied exactly once" is a count.
"""

from __future__ import annotations

import threading
import time

from django.db import connection

from journal.envelopes import Envelope
from journal.models import Event
from projections.declarations import lane, projection, reaction, registry

TABLE = "proj_applied"


def create_table() -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} (consumer varchar(200), stream varchar(200),"
                       " seq bigint, target varchar(200))")
        cursor.execute(f"DELETE FROM {TABLE}")


def applied(consumer: str | None = None) -> list[tuple[str, int]]:
    with connection.cursor() as cursor:
        if consumer is None:
            cursor.execute(f"SELECT stream, seq FROM {TABLE} ORDER BY stream, seq")
        else:
            cursor.execute(f"SELECT stream, seq FROM {TABLE} WHERE consumer = %s ORDER BY stream, seq", [consumer])
        return [tuple(r) for r in cursor.fetchall()]


def write(consumer: str, event, target) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {TABLE} (consumer, stream, seq, target) VALUES (%s, %s, %s, %s)",
                       [consumer, event.stream_id, event.seq, target])


def declare_counter(name: str = "counter", types=("Tick",), delay: float = 0.0, **kw):
    """A projection writing one row per event; `delay` seconds per event (to be killed mid-batch)."""

    def handle(event, target):
        if delay:
            time.sleep(delay)
        write(name, event, target)

    return projection(name, on=types, handler=handle, **kw)


def declare_failing(name: str = "picky", bad_stream: str = "bad") -> None:
    """A projection that always fails on one stream and works on every other."""

    def handle(event, target):
        if event.stream_id == bad_stream:
            raise ValueError(f"cannot project {event.stream_id}#{event.seq}")
        write(name, event, target)

    projection(name, on=["Tick"], handler=handle)


def declare_lanes(release: threading.Event, started: threading.Event) -> None:
    """A slow lane whose reaction waits for `release`, and a fast lane with a projection."""
    lane("slow", cycle_ms=20)
    lane("fast", cycle_ms=20)

    @reaction("slow-hook", on=["Slow"], lane="slow", atomic=False)
    def slow(event, target):
        started.set()
        release.wait(60)

    declare_counter("fast-counter", types=("Fast",), lane="fast")


def produce(prefix: str, streams: int, rounds: int) -> int:
    """Append Tick (reactive) and Noise (not) events in batches; returns the Ticks written."""
    from journal.envelopes import AppendItem

    ticks = 0
    for r in range(rounds):
        items = []
        for s in range(streams):
            envs = [Envelope("Tick", {"r": r}), Envelope("Noise", {})] if (r + s) % 2 else [Envelope("Tick", {"r": r})]
            items.append(AppendItem.build(f"{prefix}{s}", envs))
            ticks += 1
        Event.objects.append_batch(items)
    return ticks


def clear() -> None:
    registry.clear()
