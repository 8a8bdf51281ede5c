"""Section `replay` of bench_reactions: rebuilding a read model, per-event vs batch."""

from __future__ import annotations

import time

from django.db import connection
from django.test.utils import override_settings

from benchmarks import streams
from benchmarks.arguments import positive_int_list
from benchmarks.sections.reactions.support import cleanup, subscribe
from journal.envelopes import Envelope
from journal.models import Event
from projections.declarations import projection
from projections.models import Checkpoint
from projections.service import drain


def add_arguments(parser) -> None:
    parser.add_argument("--replay", type=positive_int_list, default="1000,5000", help="Replay section: event counts.")


def run(ctx) -> None:
    """Rebuild a read model of N events (10 streams) with real upserts: per-event vs batch."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS bench_proj_totals (stream varchar(200) PRIMARY KEY,"
                       " n bigint NOT NULL, total bigint NOT NULL)")
    upsert = ("INSERT INTO bench_proj_totals (stream, n, total) VALUES (%s, 1, %s) ON CONFLICT (stream)"
              " DO UPDATE SET n = bench_proj_totals.n + 1, total = bench_proj_totals.total + excluded.total")
    for events in ctx.options["replay"]:
        pfx = streams.prefix(ctx.run_id, "replay", events)
        per_stream = events // 10
        sids = [f"{pfx}{i}" for i in range(10)]
        for start in range(0, per_stream, 500):
            k = min(500, per_stream - start)
            Event.objects.append_batch([(sid, [Envelope("BenchAdded", {"v": 1})] * k) for sid in sids])
        for variant in ("per-event, one transaction each", "per-event", "batch"):
            name = f"bench-replay-{ctx.run_id}-{events}-{variant.split(',')[0]}-{len(variant)}"
            with connection.cursor() as cursor:
                cursor.execute("DELETE FROM bench_proj_totals WHERE stream LIKE %s", [pfx + "%"])

            def one(event, target):
                with connection.cursor() as cursor:
                    cursor.execute(upsert, [event.stream_id, event.payload["v"]])

            def many(evs, target):
                # One statement for the claim: the events folded per stream first, then one upsert.
                folded: dict[str, list[int]] = {}
                for e in evs:
                    f = folded.setdefault(e.stream_id, [0, 0])
                    f[0] += 1
                    f[1] += e.payload["v"]
                with connection.cursor() as cursor:
                    cursor.executemany(
                        "INSERT INTO bench_proj_totals (stream, n, total) VALUES (%s, %s, %s) ON CONFLICT (stream)"
                        " DO UPDATE SET n = bench_proj_totals.n + excluded.n,"
                        " total = bench_proj_totals.total + excluded.total",
                        [(s, n, t) for s, (n, t) in folded.items()])

            if variant == "batch":
                projection(name, on=["BenchAdded"], batch=many, source=pfx)
            else:
                projection(name, on=["BenchAdded"], handler=one, source=pfx)
            Checkpoint.objects.filter(consumer=name).delete()
            try:
                # Subscribe first (correlation is not what is measured), then time the drain only.
                subscribe(name, sids)
                batch = 1 if variant.startswith("per-event,") else 500
                with override_settings(LOOM_DRAIN_BATCH=batch, LOOM_DRAIN_STREAMS=10):
                    t = time.perf_counter()
                    result = drain(scan=False)
                    wall = time.perf_counter() - t
                with connection.cursor() as cursor:
                    cursor.execute("SELECT COALESCE(SUM(n), 0) FROM bench_proj_totals WHERE stream LIKE %s",
                                   [pfx + "%"])
                    rows = cursor.fetchone()[0]
                ctx.verify(f"replay {events} {variant}: projected", events, int(rows))
                ctx.verify(f"replay {events} {variant}: handled", events, result.handled)
                ctx.record(f"replay {variant}", {"events": events, "streams": 10, "batch": batch},
                           throughput=events / wall, unit="events/s", count=events, wall_ms=round(wall * 1000, 1))
            finally:
                cleanup(ctx, [name], None)
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM bench_proj_totals WHERE stream LIKE %s", [pfx + "%"])
        if not ctx.options.get("keep"):
            streams.remove(pfx)
