"""Section `watermark` of bench_reactions: drain cycles over many caught-up subscriptions."""

from __future__ import annotations

import time

from benchmarks import streams
from benchmarks.arguments import positive_int
from benchmarks.sections.reactions.support import cleanup
from journal.envelopes import Envelope
from journal.models import Event
from projections.correlate import correlate, start_at_tip
from projections.declarations import reaction, registry
from projections.drain import DrainController
from projections.store import store_for


def add_arguments(parser) -> None:
    parser.add_argument("--subscriptions", type=positive_int, default=10_000, help="Watermark section: subscriptions.")


def run(ctx) -> None:
    """N caught-up subscriptions plus 10 with work: ms per drain cycle and rows claimed."""
    n = ctx.options["subscriptions"]
    pfx = streams.prefix(ctx.run_id, "wm")
    name = f"bench-wm-{ctx.run_id}"
    handled = []
    reaction(name, on=["BenchWm"], atomic=False)(lambda e, t: handled.append(e.seq))
    start_at_tip([name])
    try:
        # caught up, no events yet
        store_for().insert_caught_up([(name, f"{pfx}{i}", "default", 0, -1, -1) for i in range(n)])
        active = [f"{pfx}{i}" for i in range(0, n, max(1, n // 10))][:10]
        for sid in active:
            Event.objects.append(sid, Envelope("BenchWm"))
        controller = DrainController(registry, registry.lanes["default"], "bench-wm")
        times, claimed = [], []
        for r in range(20):
            if r:
                Event.objects.append_batch([(sid, Envelope("BenchWm")) for sid in active])
            correlate(registry)
            t = time.perf_counter()
            result = controller.cycle()
            times.append((time.perf_counter() - t) * 1000)
            claimed.append(result.claimed)
        ctx.verify("watermark: handled", 10 * 20, len(handled))
        ctx.record("watermark-aware claim", {"subscriptions": n, "active": 10, "cycles": 20},
                   unit="ms/cycle", latencies_ms=times, count=20, claimed_per_cycle=max(claimed))
    finally:
        cleanup(ctx, [name], pfx)
