"""Compaction of aggregate streams: the events before a stream's newest snapshot are deleted.

    State("Ticket", Ticket, snapshot_every=100, compact=True)     # or, from settings:
    LOOM_COMPACT_AGGREGATES = ["Ticket"]                           # "*": every declared state

What is kept: the newest snapshot, the event it was taken at (seq N: the stream's tip is read from its events,
so the newest event must stay) and every event after it. What is deleted: the events with seq < N and the
older snapshots, in batches of LOOM_COMPACT_BATCH events, each its own short transaction that takes no lock an
append waits on (journal/store/retention.py, the statements and their locks). Each batch is recorded in
journal_compaction. Never compacted: a sensitive state (it has no snapshot: a checkpoint would hold in clear
what the log holds sealed, docs/privacy.md), a stream whose newest snapshot no longer fits its state's schema
(it would then load from nothing), a stream with an execution header (a flow's log).

Under LOOM_SHARDS each shard compacts its own streams (`run(alias)`; `run_each` goes shard by shard, naming one
that does not answer while the others are compacted), records its batches there, under its own compactor lock.

Readers of a compacted stream (docs/retention.md, "Compaction"): the aggregate runtime loads from the snapshot
and raises CompactedStream where it would have replayed from seq 0; `Event.objects.read(stream)` returns the
kept events, from seq N (`first_seq` says where the stream starts); the admin says "compacted before seq N";
a projection replayed from the start sees the stream from seq N, and the drain logs a warning naming it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from django.utils import timezone
from pydantic import ValidationError

from journal import conf, shards
from journal.atomic import atomic

log = logging.getLogger("loom.compaction")

CANDIDATES_PAGE = 500  # streams read per candidates query


def parse_compacted(entries: list) -> frozenset[str]:
    """LOOM_COMPACT_AGGREGATES as a set of state names (`*`: all); ValueError names the bad entry."""
    if not isinstance(entries, (list, tuple)):
        raise ValueError(f"a list of aggregate state names, got {entries!r}")
    found: set[str] = set()
    for entry in entries:
        if not isinstance(entry, str) or not entry.strip() or entry != entry.strip() or "\x00" in entry:
            raise ValueError(f"entries are aggregate state names (or '*'), got {entry!r}")
        if entry in found:
            raise ValueError(f"{entry!r} is named twice")
        found.add(entry)
    return frozenset(found)


def compacted_states() -> list:
    """The declared states whose streams are compacted (State(compact=True) or LOOM_COMPACT_AGGREGATES), with a
    snapshot policy and not sensitive. A bad setting raises conf.ConfigError before anything is read."""
    from journal.aggregates.declarations import states  # app registry: the aggregates import the models

    named = parse_compacted(conf.get("LOOM_COMPACT_AGGREGATES"))
    chosen = [st for st in states().values() if st.compact or "*" in named or st.name in named]
    unknown = named - {"*"} - set(states())
    if unknown:
        log.warning("LOOM_COMPACT_AGGREGATES names no declared state: %s", ", ".join(sorted(unknown)))
    return [st for st in chosen if st.snapshot_every is not None and not st.sensitive]


def _store(alias: str):
    from journal.store import retention_store_for  # app registry: the stores import the models

    return retention_store_for(alias)


def first_seq(stream_id: str, alias: str | None = None) -> int | None:
    """Where the stream starts now: 0, or N > 0 once it was compacted before seq N (None: no events)."""
    return _store(alias or shards.shard_for(stream_id)).first_seq(stream_id)


@dataclass
class Compacted:
    """What the compaction of one stream did."""

    stream: str
    before: int = -1
    events: int = 0
    snapshots: int = 0
    batches: int = 0
    skipped: str = ""  # why nothing was done ('' if something was, or nothing was due)


def _fits(st, state: object) -> bool:
    try:
        st.schema.model_validate(state)
    except ValidationError:
        return False
    return True


def compact_stream(st, stream: str, alias: str, now: datetime | None = None, batch: int | None = None,
                   max_batches: int | None = None) -> Compacted:
    """Delete the events of `stream` before its newest snapshot, `batch` events per transaction."""
    now = now or timezone.now()
    batch = batch or conf.get("LOOM_COMPACT_BATCH")
    store = _store(alias)
    done = Compacted(stream)
    while max_batches is None or done.batches < max_batches:
        with atomic(alias):
            if not store.try_compact_lock():
                done.skipped = "another compactor holds this shard's lock"
                return done
            if store.exists(stream):  # an execution header or fence of a flow: never an aggregate's
                done.skipped = "a flow's stream"
                return done
            newest = store.newest_snapshot(stream)
            if newest is None:
                done.skipped = "no snapshot"
                return done
            before, state = newest
            if not _fits(st, state):
                done.skipped = f"its snapshot at seq {before} no longer fits {st.name}'s schema"
                log.warning("compaction skips %s: %s", stream, done.skipped)
                return done
            events = store.compact_events(stream, before, batch)
            snapshots = store.compact_snapshots(stream, before) if events < batch else 0
            if not events and not snapshots:
                return done
            store.record_compaction(now, st.name, stream, before, events, snapshots)
        done.before, done.events, done.snapshots = before, done.events + events, done.snapshots + snapshots
        done.batches += 1
        if events < batch:
            break
    if done.events:
        log.info("compacted %s before seq %d: %d event(s), %d snapshot(s) on %s", stream, done.before, done.events,
                 done.snapshots, alias)
    return done


def run(alias: str, now: datetime | None = None, max_batches: int | None = None) -> dict[str, int]:
    """Compact every stream of the compacted states on `alias`: the totals."""
    totals = {"streams": 0, "events": 0, "snapshots": 0, "batches": 0}
    store = _store(alias)
    for st in compacted_states():
        after = ""
        while True:
            page = store.compact_candidates(st.prefix, after, CANDIDATES_PAGE)
            for stream, snap_seq in page:
                first = store.first_seq(stream)
                if first is None or first >= snap_seq:
                    continue  # nothing before its newest snapshot
                left = None if max_batches is None else max_batches - totals["batches"]
                if left is not None and left <= 0:
                    return totals
                done = compact_stream(st, stream, alias, now, max_batches=left)
                if done.batches:
                    totals["streams"] += 1
                    for key in ("events", "snapshots", "batches"):
                        totals[key] += getattr(done, key)
                if done.skipped.startswith("another compactor"):
                    return totals
            if len(page) < CANDIDATES_PAGE:
                break
            after = page[-1][0]
    return totals


def run_each(aliases: list[str], now: datetime | None = None,
             max_batches: int | None = None) -> tuple[dict[str, dict[str, int]], dict[str, str]]:
    """`run` on each shard in turn (each shard's streams on that shard, its batches recorded there, under that
    shard's own compactor lock): (totals per alias, the aliases that could not be reached -> the error's first
    line). A shard that does not answer is named and the others are still compacted (shards.read_each); what
    a shard that failed midway had committed stays committed (each batch is its own transaction)."""
    unreachable: dict[str, str] = {}
    found = shards.read_each(aliases, lambda alias: (alias, run(alias, now, max_batches)), unreachable)
    return dict(found), unreachable


def status(alias: str, recent: int = 10) -> dict:
    """The compacted states and the newest compaction batches on `alias`."""
    from journal.models import Compaction  # app registry: models need the apps loaded

    batches = [{"id": c.id, "compacted_at": c.compacted_at.isoformat(), "state": c.state, "stream": c.stream_id,
                "before_seq": c.before_seq, "events": c.events, "snapshots": c.snapshots}
               for c in Compaction.objects.using(alias).order_by("-id")[:recent]]
    return {"alias": alias, "states": [st.name for st in compacted_states()], "compacted": batches}

