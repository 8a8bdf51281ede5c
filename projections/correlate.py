"""Correlation: find the (consumer, stream) pairs with new events and raise their subscriptions' tips.

Two paths feed the same idempotent upsert (store.bump):
- the journal's NOTIFY payload (`tips` per stream, `types` of the statement), in the listener,
  for the low-latency case (see `bumps_from_notification`);
- a scan of the log from each consumer's advancing checkpoint (global event ids), the safety net
  for lost notifications, SQLite, poolers without LISTEN and new consumers catching up history.

Global ids are handed out at insert time, so under concurrency a lower id can commit after a higher
one. The checkpoint therefore never passes a missing id unless that id has been missing for longer
than LOOM_CORRELATE_HORIZON_SECONDS (then its transaction rolled back, or it is older than any
write transaction should be and its commit's NOTIFY carries it): see docs/projections.md.
The drain itself does not depend on this: watermarks are per-stream seqs, which have no gaps.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Sequence
from datetime import timedelta

from journal import conf, shards
from journal.atomic import atomic
from journal.store import store_for as journal_store
from projections.declarations import Consumer, Registry
from projections.store import store_for
from projections.store.base import Bump, CheckpointRow, ScannedEvent

log = logging.getLogger("loom.projections")

MAX_PAGES = 20  # pages one correlate() reads at most; the next call continues


def _bump(consumer: Consumer, stream: str, seq: int) -> Bump:
    return (consumer.name, stream, consumer.source, consumer.lane, consumer.priority, seq)


def route(consumers: Iterable[Consumer], events: Iterable[ScannedEvent]) -> list[Bump]:
    """The highest seq of each (consumer, stream) among the events the consumers follow."""
    best: dict[tuple[str, str], tuple[Consumer, int]] = {}
    consumers = list(consumers)
    for e in events:
        for c in consumers:
            if c.follows(e.stream_id, e.type):
                key = (c.name, e.stream_id)
                if key not in best or best[key][1] < e.seq:
                    best[key] = (c, e.seq)
    return [_bump(c, stream, seq) for (_, stream), (c, seq) in best.items()]


_warned: dict[str, float] = {}  # consumer -> monotonic time of the last warning (logging only)


def _warn_held(consumer: str, gap: int, xmax: int | None, oldest: int | None) -> None:
    """Say, at most once a minute per consumer, that a long transaction holds correlation at a gap."""
    now = time.monotonic()
    if now - _warned.get(consumer, -1e9) >= 60:
        _warned[consumer] = now
        log.warning("correlation of %s waits at id %s: transaction %s (older than xid %s) is still running; "
                    "later ids are re-read each scan until it ends", consumer, gap, oldest, xmax)


def settle(row: CheckpointRow, ids: Sequence[int], now, horizon: float, xmax: int | None = None,
           oldest: int | None = None) -> CheckpointRow:
    """The checkpoint after a scan that saw `ids` (ascending, all > row.position) at `now`.

    Contiguous ids advance the position at once. A gap stops it; the largest id seen is then
    remembered with the time (the horizon). Without transaction information (SQLite: xmax None,
    where gaps are final anyway) a later scan that finds the horizon older than `horizon` seconds
    settles everything up to it, gaps included.

    On PostgreSQL time alone is not enough: a transaction that allocated a missing id may simply
    be slow, and if its commit's notification is not seen (listener away, {"poll": true}) its events
    would never be correlated. So once the horizon has aged, the scan records the snapshot's `xmax`
    (every transaction that allocated an id up to horizon_id got its xid within microseconds of it,
    long before), and the gap settles only at a later scan whose `oldest` running xid (other
    sessions) is at least that: every such transaction has ended, so this scan, which starts after
    the clock was read, sees the missing id if it committed.
    """
    position, hid, hat, hx = row.position, row.horizon_id, row.horizon_at, row.horizon_xmax
    timed = hat is not None and now - hat >= timedelta(seconds=horizon)
    aged = timed and (xmax is None or (hx is not None and oldest is not None and oldest >= hx))
    if aged:
        position = max(position, hid)
    for i in ids:
        if i <= position:
            continue
        if i != position + 1:
            break
        position = i
    seen = ids[-1] if ids else position
    if position >= seen:
        return CheckpointRow(row.consumer, position, position, None)
    if hat is None or aged:
        return CheckpointRow(row.consumer, position, seen, now)
    if timed and hx is None:
        hx = xmax  # aged by time: from now on, wait for the transactions running now
    elif timed and now - hat >= timedelta(seconds=max(60.0, 30 * horizon)):
        _warn_held(row.consumer, position + 1, hx, oldest)
    return CheckpointRow(row.consumer, position, hid, hat, hx)


def correlate(registry: Registry, alias: str | None = None) -> int:
    """One scan for every declared consumer on one shard (default: the bound or first shard), by at most one
    worker at a time. Returns bumps made."""
    alias = alias or shards.home()
    consumers = list(registry.consumers.values())
    if not consumers:
        return 0
    store = store_for(alias)
    horizon = conf.get("LOOM_CORRELATE_HORIZON_SECONDS")
    page = conf.get("LOOM_CORRELATE_BATCH")
    bumped = 0
    with atomic(alias):
        if not store.try_correlate_lock():
            return 0
        rows, clock = store.checkpoints([c.name for c in consumers])
        known = {r.consumer: r for r in rows}
        # A consumer seen for the first time starts from the beginning of the log.
        states = {c.name: known.get(c.name, CheckpointRow(c.name, 0, 0, None)) for c in consumers}
        groups: dict[tuple, list[Consumer]] = {}
        for c in consumers:
            s = states[c.name]
            groups.setdefault((s.position, s.horizon_id, s.horizon_at, s.horizon_xmax), []).append(c)
        changed: list[CheckpointRow] = []
        for (position, *_), members in groups.items():
            ids: list[int] = []
            cursor = position
            for _ in range(MAX_PAGES):
                events = store.scan(cursor, page)
                if not events:
                    break
                bumped += store.bump(route(members, events))
                ids.extend(e.id for e in events)
                cursor = events[-1].id
                if len(events) < page:
                    break
            for c in members:
                new = settle(states[c.name], ids, clock.now, horizon, clock.xmax, clock.oldest)
                if new != states[c.name] or c.name not in known:
                    changed.append(new)
        store.save_checkpoints(changed)
    return bumped


MAX_SEQ = 2**63 - 1
MAX_STREAM = 200  # projections_subscription.stream


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")  # a lone surrogate (valid in JSON escapes) cannot be sent to the database
    except UnicodeEncodeError:
        return False
    return True


def parse_notification(payload: str) -> tuple[dict[str, int], frozenset[str]] | None:
    """The tips and types of a journal notification, or None if the payload is not one.

    Any role that can connect may NOTIFY the channel, so a payload is a hint, never trusted:
    it must be an object with a non-empty `tips` object of stream id -> seq (a non-negative
    integer, not a bool) and a `types` list of strings. Anything else (and {"poll": true})
    is answered with a scan of the log, which only believes committed events.
    """
    try:
        data = json.loads(payload)
    except (ValueError, TypeError, RecursionError):
        return None
    if not isinstance(data, dict) or data.get("poll") is not None:
        return None
    tips, types = data.get("tips"), data.get("types")
    if not isinstance(tips, dict) or not tips or not isinstance(types, list):
        return None
    for stream, seq in tips.items():
        if not 0 < len(stream) <= MAX_STREAM or "\x00" in stream or not _encodable(stream):
            return None
        if type(seq) is not int or not 0 <= seq <= MAX_SEQ:
            return None
    if not all(isinstance(t, str) for t in types):
        return None
    return tips, frozenset(types)


def bumps_from_notification(registry: Registry, payload: str) -> tuple[list[Bump], bool]:
    """What a NOTIFY payload tells: bumps to try, and whether a scan is needed to know the rest.

    The payload has each stream's new tip and the statement's distinct types, not which stream got
    which type. A bump is exact when the statement wrote one stream, or when every type it wrote is
    followed by the consumer; otherwise (mixed multi-stream batch) the scan sorts it out.
    {"poll": true} (payload over 8000 bytes) and anything malformed ask for a scan. The tips are
    still hints: store.bump(..., hinted=True) clamps each to the stream's real last seq.
    """
    parsed = parse_notification(payload)
    if parsed is None:
        return [], True
    return bumps_from_tips(registry, *parsed)


def bumps_from_tips(registry: Registry, tips: dict[str, int], types: frozenset[str]) -> tuple[list[Bump], bool]:
    """The bumps of a parsed notification (see bumps_from_notification), and whether to scan."""
    bumps: list[Bump] = []
    scan = False
    for c in registry.consumers.values():
        if not (types & c.types):
            continue  # drain skip: nothing this consumer follows was committed
        if len(tips) == 1 or types <= c.types:
            bumps.extend(_bump(c, s, seq) for s, seq in tips.items() if s.startswith(c.source))
        else:
            scan = True
    return bumps, scan


def start_at_tip(names: Iterable[str], alias: str | None = None) -> None:
    """Make new consumers follow only what is committed from now on (no history scan), on one shard, or on
    every shard when none is named (each shard's journal has its own positions).

    Their checkpoint starts at the current last id; events before it are never correlated for them.
    """

    names = list(names)
    for each in [alias] if alias else shards.shards():
        top = journal_store(each).last_event_id()
        store_for(each).save_checkpoints([CheckpointRow(n, top, top, None) for n in names])
