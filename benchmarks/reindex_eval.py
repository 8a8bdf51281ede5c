"""Index sizes under removal, with and without the retention service's index rebuild (journal/reindex.py), in one
run on two databases of the same PostgreSQL server, their rounds interleaved (docs/benchmarks.md, "Index sizes
under removal: REINDEX CONCURRENTLY").

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/compact_ia \\
    SHARD_DATABASE_URLS="rebuilt=postgres://postgres@127.0.0.1:5432/compact_ib" \\
    python manage.py shell -c "from benchmarks.reindex_eval import main; main(rounds=4, events=500_000)"

Each round, on each database: the growth section's intake (settled executions of 10 events each, a new id range per
round, spread over 400 days; journal/store/retention.py fill_settled), removal of what is past 30 days
(journal.retention.run), VACUUM; then on `rebuilt` only, journal.reindex.run with LOOM_REINDEX_RATIO while one
thread appends to a stream of its own (each append's latency recorded, and the same thread's appends before
the rebuild as the baseline). Prints one JSON document: each round's sizes after VACUUM (and after the rebuild).
"""

from __future__ import annotations

import json
import statistics
import threading
import time

from django.db import connections
from django.test import override_settings
from django.utils import timezone

from journal import reindex, retention, shards
from journal.envelopes import Envelope
from journal.models import Event
from journal.store import retention_store_for

PER_STREAM = 10
DAYS = 400.0
RETENTION_DAYS = 30
FLOW = "bench.growth.settled"


def _mb(sizes: dict | None) -> dict:
    return {k: round(v / 1e6, 1) for k, v in (sizes or {}).items()}


def _appends(alias: str, stream: str, stop: threading.Event, out: list[float]) -> None:
    try:
        with shards.bound(alias):
            while not stop.is_set():
                began = time.perf_counter()
                Event.objects.append(stream, [Envelope("Probe", {"n": len(out)})])
                out.append((time.perf_counter() - began) * 1000)
                time.sleep(0.005)
    finally:
        connections.close_all()


def _probe(alias: str, stream: str, seconds: float) -> list[float]:
    stop, out = threading.Event(), []
    thread = threading.Thread(target=_appends, args=(alias, stream, stop, out))
    thread.start()
    time.sleep(seconds)
    stop.set()
    thread.join()
    return out


def _p(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


def main(rounds: int = 4, events: int = 500_000, ratio: float = 1.3, aliases: tuple[str, str] = ("default", "rebuilt"),
         probe_s: float = 5.0) -> dict:
    count = events // PER_STREAM
    result: dict = {"events_per_round": events, "ratio": ratio, "rounds": []}
    for n in range(1, rounds + 1):
        row: dict = {"round": n}
        for alias in aliases:
            store = retention_store_for(alias)
            began = time.perf_counter()
            for start in range(0, count, 100_000):
                store.fill_settled(f"ix{n}_", start, min(100_000, count - start), PER_STREAM, '{"data":"filled"}',
                                   DAYS, FLOW)
            fill_s = time.perf_counter() - began
            with override_settings(LOOM_RETENTION_DAYS=None, LOOM_RETENTION_FLOWS=[f"{FLOW}={RETENTION_DAYS}"],
                                   LOOM_RETENTION_BATCH=500, LOOM_ARCHIVE_FLOWS=[]):
                t0 = time.perf_counter()
                done = retention.run(alias, now=timezone.now())
                removal_s = time.perf_counter() - t0
            store.vacuum()
            cell = {"fill_s": round(fill_s, 1), "removed_events": done["events"],
                    "removal_events_per_s": round(done["events"] / removal_s) if removal_s else None,
                    "vacuumed_mb": _mb(store.table_sizes())}
            if alias == aliases[1]:
                stream = f"probe-{n}"
                baseline = _probe(alias, stream, probe_s)
                stop, during = threading.Event(), []
                thread = threading.Thread(target=_appends, args=(alias, stream, stop, during))
                thread.start()
                t0 = time.perf_counter()
                rebuilt = reindex.run(alias, ratio=ratio)
                cell["rebuild_s"] = round(time.perf_counter() - t0, 1)
                stop.set()
                thread.join()
                cell["rebuilt"] = [{"index": r["index"], "before_mb": round(r["before"] / 1e6, 1),
                                    "after_mb": round((r["after"] or 0) / 1e6, 1), "s": r["seconds"]}
                                   for r in rebuilt.rebuilt]
                cell["skipped"] = rebuilt.skipped
                cell["after_rebuild_mb"] = _mb(store.table_sizes())
                cell["appends_baseline_ms"] = {"n": len(baseline), "p50": _p(baseline, 0.5), "p99": _p(baseline, 0.99),
                                               "max": _p(baseline, 1.0)}
                cell["appends_during_rebuild_ms"] = {"n": len(during), "p50": _p(during, 0.5),
                                                     "p99": _p(during, 0.99), "max": _p(during, 1.0),
                                                     "median_ratio": round(statistics.median(during)
                                                                           / statistics.median(baseline), 2)
                                                     if during and baseline else None}
            row[alias] = cell
        result["rounds"].append(row)
        print(json.dumps(row), flush=True)
    print(json.dumps(result, indent=1), flush=True)
    return result
