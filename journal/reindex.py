"""Index upkeep: rebuild the indexes of journal_event once removal has left them bloated.

    LOOM_REINDEX_RATIO = 1.5    # journal_event's indexes past 1.5 times its heap's bytes are rebuilt; None: never

Only journal_event, the table removal and compaction shrink most: its heap is a yardstick of what its indexes
should take (about 0.57 times it after a rebuild, with the growth section's payloads: docs/benchmarks.md).
journal_execution's small heap is none (its indexes were 15-18 times it in that measure); rebuild its indexes by
hand (docs/backends.md).

Why (docs/backends.md, "Index sizes under removal"): removal deletes old executions' rows; VACUUM gives their heap
space back to new rows, but a B-tree leaf page emptied by the deletes only takes keys of its own key range again.
Execution ids are ordered by time of creation (each intake round a new key range), so the freed pages of removed
ranges are not reused and the indexes grow by about half their size per retention period while the heap stays
flat. `REINDEX INDEX CONCURRENTLY` builds a packed copy beside each index and swaps it in, with no lock that
appends, reads or removal wait on (journal/store/retention.py REINDEX, its locks).

The worker's retention service calls `run(alias)` after its removal and compaction (each shard in turn), at most
once per LOOM_REINDEX_EVERY seconds per process: one rebuilder per shard (a session advisory lock), one index at a
time, outside any transaction. A rebuild stopped midway leaves an invalid `<index>_ccnew` copy that every write
still updates: it is dropped first. PostgreSQL only (SQLite's indexes are rebuilt by its own VACUUM); refused
behind a transaction-pooling PgBouncer (a session lock does not hold there: rebuild by hand, docs/backends.md).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from django.db import connections

from journal import conf

log = logging.getLogger("loom.retention")


@dataclass
class Rebuilt:
    """What one `run` did on one alias."""

    alias: str
    rebuilt: list[dict] = field(default_factory=list)  # {"index", "before", "after", "seconds"}
    dropped: list[str] = field(default_factory=list)  # leftover invalid copies
    skipped: str = ""  # why nothing was looked at ('' if it was)


def _store(alias: str):
    from journal.store import retention_store_for  # app registry: the stores import the models

    return retention_store_for(alias)


def due(alias: str, ratio: float) -> list[tuple[str, int, int]]:
    """(index, its bytes, its table's heap bytes) of the tables whose indexes together pass `ratio` times the heap."""
    sizes = _store(alias).index_sizes()
    tables: dict[str, list[tuple[str, int, int]]] = {}
    for table, index, size, heap in sizes:
        tables.setdefault(table, []).append((index, size, heap))
    found = []
    for indexes in tables.values():
        heap = indexes[0][2]
        if heap and sum(size for _, size, _ in indexes) > ratio * heap:
            found += indexes
    return found


def run(alias: str, ratio: float | None = None) -> Rebuilt:
    """Rebuild, one at a time, the indexes of each table whose indexes have passed `ratio` (LOOM_REINDEX_RATIO)
    times its heap; first drop what an interrupted rebuild left."""
    from journal.store.postgres import behind_pooler  # app registry: the stores import the models

    done = Rebuilt(alias)
    ratio = conf.get("LOOM_REINDEX_RATIO") if ratio is None else ratio
    connection = connections[alias]
    if ratio is None:
        done.skipped = "LOOM_REINDEX_RATIO is not set"
        return done
    if connection.vendor != "postgresql":
        done.skipped = "not PostgreSQL (SQLite's VACUUM rebuilds its indexes)"
        return done
    if behind_pooler(connection):
        done.skipped = "behind a transaction pooler: a session lock does not hold there; rebuild by hand"
        return done
    if connection.in_atomic_block:
        raise RuntimeError("index rebuilds run outside any transaction (REINDEX ... CONCURRENTLY)")
    store = _store(alias)
    if not store.try_reindex_lock():
        done.skipped = "another process rebuilds this shard's indexes"
        return done
    try:
        for index in store.leftover_rebuilds():
            store.drop_leftover(index)
            done.dropped.append(index)
            log.warning("dropped %s on %s: an invalid copy an interrupted index rebuild left", index, alias)
        for index, before, heap in due(alias, ratio):
            began = time.perf_counter()
            store.reindex(index)
            after = next((size for _, name, size, _ in store.index_sizes() if name == index), None)
            done.rebuilt.append({"index": index, "before": before, "after": after, "heap": heap,
                                 "seconds": round(time.perf_counter() - began, 2)})
            log.info("rebuilt %s on %s: %d -> %s bytes (heap %d) in %.1f s", index, alias, before, after, heap,
                     time.perf_counter() - began)
    finally:
        store.reindex_unlock()
    return done
