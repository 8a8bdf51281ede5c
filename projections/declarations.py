"""Declaring reactions and projections: which event types they follow, where they write, which lane.

    @reaction("send-invoice", on=["OrderPlaced"], target=lambda e: f"invoice-{e.payload['order']}")
    def send_invoice(event, target): Event.objects.append(target, Envelope("InvoiceDue", ...))

    tickets = projection("tickets", on=["TicketOpened", "TicketClosed"], batch=write_many, reset=wipe)

A consumer follows every source stream (optionally only those starting with `source`) that has
one of its event types; each (consumer, stream) pair is a Subscription with its own watermark.
`target` is the stream the consumer writes to: a string (static) or a function of the event
(dynamic), handed to the handler with each event.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from journal.envelopes import StoredEvent
from projections.exceptions import DeclarationError

NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,200}$")
DEFAULT_LANE = "default"

Handler = Callable[[StoredEvent, str | None], Any]
BatchHandler = Callable[[list[StoredEvent], str], Any]
Target = str | Callable[[StoredEvent], str] | None


@dataclass(frozen=True)
class Lane:
    """A group of consumers drained on its own thread and cadence, so a slow one never delays another.

    cycle_ms: the lane's polling cadence (0: LOOM_DRAIN_POLL_MS); wake-ups from notifications are
    immediate either way. streams/batch: claim size and events per stream (None: the LOOM_DRAIN_*).
    """

    name: str
    cycle_ms: int = 0
    streams: int | None = None
    batch: int | None = None


@dataclass(frozen=True)
class Consumer:
    """A declared reaction or projection."""

    name: str
    types: frozenset[str]
    handler: Handler | None = None
    batch: BatchHandler | None = None
    target: Target = None
    lane: str = DEFAULT_LANE
    priority: int = 0
    source: str = ""
    atomic: bool = True  # run handler(s) and ack in one transaction (exactly-once for DB effects)
    reset: Callable[[], Any] | None = None
    kind: str = "reaction"

    def resolve(self, event: StoredEvent) -> str | None:
        """The target stream of one event: the static target, or the resolver's answer."""
        if callable(self.target):
            return self.target(event)
        return self.target

    @property
    def dynamic(self) -> bool:
        return callable(self.target)

    def follows(self, stream_id: str, type_: str) -> bool:
        return type_ in self.types and stream_id.startswith(self.source)


@dataclass
class Registry:
    consumers: dict[str, Consumer] = field(default_factory=dict)
    lanes: dict[str, Lane] = field(default_factory=lambda: {DEFAULT_LANE: Lane(DEFAULT_LANE)})

    def add(self, consumer: Consumer) -> Consumer:
        if not NAME.match(consumer.name):
            raise DeclarationError(f"consumer name {consumer.name!r}: 1 to 200 of letters, digits, _ . : -")
        if consumer.name in self.consumers:
            raise DeclarationError(f"a reaction or projection named {consumer.name!r} is already declared")
        if not consumer.types:
            raise DeclarationError(f"{consumer.name} follows no event types (give on=[...])")
        if consumer.handler is None and consumer.batch is None:
            raise DeclarationError(f"{consumer.name} has neither a handler nor a batch handler")
        if consumer.batch is not None and consumer.dynamic:
            raise DeclarationError(f"{consumer.name}: a batch handler needs a static target (or none)")
        self.lanes.setdefault(consumer.lane, Lane(consumer.lane))
        self.consumers[consumer.name] = consumer
        return consumer

    def lane(self, name: str, cycle_ms: int = 0, streams: int | None = None, batch: int | None = None) -> Lane:
        if not NAME.match(name):
            raise DeclarationError(f"lane name {name!r}: 1 to 100 of letters, digits, _ . : -")
        if cycle_ms < 0 or (streams is not None and streams < 1) or (batch is not None and batch < 1):
            raise DeclarationError(f"lane {name}: cycle_ms >= 0, streams >= 1 and batch >= 1")
        item = self.lanes[name] = Lane(name, cycle_ms, streams, batch)
        return item

    def in_lane(self, lane: str | None) -> list[Consumer]:
        return [c for c in self.consumers.values() if lane is None or c.lane == lane]

    def reactive_types(self, lane: str | None = None) -> frozenset[str]:
        """Event types some consumer (of the lane) follows: others never cause drain work."""
        return frozenset(t for c in self.in_lane(lane) for t in c.types)

    def remove(self, name: str) -> None:
        self.consumers.pop(name, None)

    def clear(self) -> None:
        self.consumers.clear()
        self.lanes.clear()
        self.lanes[DEFAULT_LANE] = Lane(DEFAULT_LANE)


registry = Registry()


def _types(on: Iterable[str] | str) -> frozenset[str]:
    return frozenset([on] if isinstance(on, str) else on)


def reaction(name: str, *, on: Iterable[str] | str, target: Target = None, lane: str = DEFAULT_LANE,
             priority: int = 0, source: str = "", atomic: bool = True) -> Callable[[Handler], Handler]:
    """Decorator: call `handler(event, target)` for every event of the given types, once per event.

    atomic=True runs the handler and the watermark update in one transaction: what the handler
    writes to the database (events through Event.objects.append, rows) commits exactly once.
    atomic=False for handlers with slow external effects: at-least-once, no transaction held open.
    """

    def decorate(handler: Handler) -> Handler:
        registry.add(Consumer(name, _types(on), handler=handler, target=target, lane=lane, priority=priority,
                              source=source, atomic=atomic, kind="reaction"))
        return handler

    return decorate


def projection(name: str, *, on: Iterable[str] | str, handler: Handler | None = None,
               batch: BatchHandler | None = None, target: str | None = None, lane: str = DEFAULT_LANE,
               priority: int = 0, source: str = "", reset: Callable[[], Any] | None = None) -> Consumer:
    """A read model: its writes and its progress commit in one transaction, so nothing applies twice.

    batch(events, stream): all events of one claim, in order, one transaction; an error rolls the
    whole batch back and the watermark stays. reset(): wipes the read model before a replay.
    """
    return registry.add(Consumer(name, _types(on), handler=handler, batch=batch, target=target or name,
                                 lane=lane, priority=priority, source=source, atomic=True, reset=reset,
                                 kind="projection"))


def lane(name: str, cycle_ms: int = 0, streams: int | None = None, batch: int | None = None) -> Lane:
    """Declare a lane and its cadence; consumers join it with lane=name."""
    return registry.lane(name, cycle_ms, streams, batch)
