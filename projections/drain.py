"""The drain of one lane: claim streams with work, hand their events to the consumers, ack.

One cycle = claim (one statement) + read (one statement on PostgreSQL) + the handlers + acks.
Atomic consumers (projections, and reactions by default) run their handlers and their ack in one
transaction: if the lease was lost the ack changes nothing, LeaseLost rolls everything back, and
the new holder applies the events instead, so database effects happen exactly once. Non-atomic
reactions are acked together at the end of the cycle (at-least-once).

A watermark only ever moves to the last event its own claim READ (each claim reads from its own
watermark, see store.read): never to the tip, which only says that work exists. An ack can therefore
not pass an event that was not delivered (or skipped because the consumer does not follow it).
"""

from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass, field

from journal import conf, shards, telemetry
from journal.atomic import atomic
from journal.envelopes import StoredEvent
from projections.declarations import Consumer, Lane, Registry
from projections.exceptions import LeaseLost
from projections.store import Claim, store_for

log = logging.getLogger("loom.projections")


@dataclass
class CycleResult:
    claimed: int = 0
    handled: int = 0  # events delivered and acked
    acked: int = 0  # subscriptions whose watermark moved
    failed: int = 0
    blocked: int = 0
    lost: int = 0  # acks refused: the lease was taken over or expired
    full: bool = False  # the claim was full: more work is likely waiting

    def add(self, other: CycleResult) -> None:
        for name in ("claimed", "handled", "acked", "failed", "blocked", "lost"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class _Failure(Exception):
    event: StoredEvent | None
    error: BaseException
    done: list[StoredEvent] = field(default_factory=list)


def describe(consumer: Consumer, claim: Claim, failure: _Failure) -> str:
    where = f"{claim.stream}#{failure.event.seq} ({failure.event.type})" if failure.event else claim.stream
    tail = "".join(traceback.format_exception(failure.error)[-3:])
    return f"{consumer.name} failed on {where}: {type(failure.error).__name__}: {failure.error}\n{tail}"[:4000]


class DrainController:
    """Drains one lane for one worker. Thread-confined: one controller per thread."""

    def __init__(self, registry: Registry, lane: Lane, worker_id: str, alias: str | None = None):
        self.registry = registry
        self.lane = lane
        self.worker_id = worker_id
        self.alias = alias or shards.home()  # the shard this controller drains (its journal, its watermarks)
        self.held: list[Claim] = []  # leases of the cycle in progress, released on stop
        self._last_blocked: bool | None = None

    @property
    def consumers(self) -> dict[str, Consumer]:
        return {c.name: c for c in self.registry.in_lane(self.lane.name)}

    @telemetry.traced_drain  # a span per drain cycle that claimed work, its batch size (a no-op when off)
    def cycle(self) -> CycleResult:
        consumers = self.consumers
        result = CycleResult()
        if not consumers:
            return result
        store = store_for(self.alias)
        limit = self.lane.streams or conf.get("LOOM_DRAIN_STREAMS")
        batch = self.lane.batch or conf.get("LOOM_DRAIN_BATCH")
        claims = store.claim(self.lane.name, list(consumers), self.worker_id, limit,
                             conf.get("LOOM_DRAIN_LEASE_SECONDS"))
        result.claimed, result.full = len(claims), len(claims) >= limit
        if not claims:
            return result
        self.held = list(claims)
        try:
            events = store.read(claims, batch)
            loose: list[tuple[Claim, int, int]] = []  # non-atomic: (claim, new at, events handled)
            ended: set[int] = set()  # claims whose read reached the end of their stream
            for claim in claims:
                consumer = consumers[claim.consumer]
                read = events.get(claim.id, [])
                if read and read[0].seq != claim.at + 1:
                    # A compacted aggregate stream (journal/compaction.py) starts at its kept snapshot: a consumer
                    # replayed from the start sees it from there. Said, not refused: the kept events are all the
                    # log has; a projection that needs the whole stream must not follow a compacted state.
                    log.warning("projection %s reads %s from seq %d, not %d: the stream was compacted before it "
                                "(docs/retention.md, Compaction)", claim.consumer, claim.stream, read[0].seq,
                                claim.at + 1)
                # The new watermark is the last event read, nothing beyond: an empty read acks nothing.
                last = read[-1].seq if read else claim.at
                if len(read) < batch:
                    ended.add(claim.id)
                mine = [e for e in read if consumer.follows(e.stream_id, e.type)]
                if consumer.atomic:
                    self._atomic(store, consumer, claim, mine, last, result, claim.id in ended)
                    continue
                try:
                    self._deliver(consumer, mine)
                    loose.append((claim, last, len(mine)))
                except _Failure as failure:
                    self._fail(store, consumer, claim, failure, result)
            if loose:
                acked = store.ack([(c, at) for c, at, _ in loose], self.worker_id, ended)
                for c, _, n in loose:
                    if c.id in acked:
                        result.acked += 1
                        result.handled += n
                    else:
                        result.lost += 1
        finally:
            self.held = []
        return result

    def _deliver(self, consumer: Consumer, events: list[StoredEvent]) -> None:
        """Run the consumer's handlers on the events in order; raise _Failure with what was done."""
        if not events:
            return
        if consumer.batch is not None:
            try:
                consumer.batch(events, consumer.resolve(events[0]))
            except Exception as exc:
                raise _Failure(None, exc) from exc
            return
        done: list[StoredEvent] = []
        for event in events:
            try:
                consumer.handler(event, consumer.resolve(event))
            except Exception as exc:
                raise _Failure(event, exc, done) from exc
            done.append(event)

    def _atomic(self, store, consumer, claim, mine, last, result: CycleResult, ended: bool = False) -> None:
        try:
            self._apply(store, consumer, claim, mine, last, ended=ended)
        except LeaseLost:
            result.lost += 1
            return
        except _Failure as failure:
            # Everything rolled back. The events before the failing one are redone in a transaction
            # that also records the failure, so one bad event does not hold back those before it.
            if failure.done:
                try:
                    self._apply(store, consumer, claim, failure.done, failure.event.seq - 1, failure)
                    result.handled += len(failure.done)
                    self._count_failure(consumer, claim, failure, result, self._last_blocked)
                    return
                except LeaseLost:
                    result.lost += 1
                    return
                except _Failure:
                    pass  # the redo failed too and rolled back: nothing was delivered
            self._fail(store, consumer, claim, failure, result, delivered=False)
            return
        result.acked += 1
        result.handled += len(mine)

    def _apply(self, store, consumer, claim, events, at, failure: _Failure | None = None,
               ended: bool = False) -> None:
        """Handlers and progress in one transaction; the progress write is fenced by the lease."""
        with atomic(self.alias):
            self._deliver(consumer, events)
            if failure is None:
                ok = bool(store.ack([(claim, at)], self.worker_id, {claim.id} if ended else ()))
            else:
                self._last_blocked = store.fail(claim, self.worker_id, describe(consumer, claim, failure),
                                                conf.get("LOOM_DRAIN_RETRIES"), conf.get("LOOM_DRAIN_RETRY_DELAY"), at)
                ok = self._last_blocked is not None
            if not ok:
                raise LeaseLost(f"lease {claim.lease} of {consumer.name} on {claim.stream} was taken over")

    def _fail(self, store, consumer, claim, failure: _Failure, result: CycleResult, delivered: bool = True) -> None:
        """Record a failure. The watermark moves past `failure.done` only if those events' effects
        stand (`delivered`): a non-atomic handler ran them; an atomic one's were rolled back."""
        at = failure.event.seq - 1 if failure.done and delivered else None
        blocked = store.fail(claim, self.worker_id, describe(consumer, claim, failure),
                             conf.get("LOOM_DRAIN_RETRIES"), conf.get("LOOM_DRAIN_RETRY_DELAY"), at)
        if at is not None and blocked is not None:
            result.handled += len(failure.done)
        self._count_failure(consumer, claim, failure, result, blocked)

    def _count_failure(self, consumer, claim, failure: _Failure, result: CycleResult, blocked: bool | None) -> None:
        result.failed += 1
        first = describe(consumer, claim, failure).splitlines()[0]
        if blocked is None:
            result.lost += 1
        elif blocked:
            result.blocked += 1
            log.error("blocked %s on %s after %s failures: %s", consumer.name, claim.stream,
                      conf.get("LOOM_DRAIN_RETRIES"), first)
        else:
            log.warning("%s", first)

    def release(self) -> None:
        """Give back the leases of an interrupted cycle (stop)."""
        if self.held:
            store_for(self.alias).release(self.held, self.worker_id)
            self.held = []
