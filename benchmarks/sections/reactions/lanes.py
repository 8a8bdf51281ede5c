"""Section `lanes` of bench_reactions: fast-lane latency beside a busy slow reaction."""

from __future__ import annotations

import time

from django.test.utils import override_settings

from benchmarks import streams
from benchmarks.sections.reactions.support import cleanup, wait, wakeup
from journal.envelopes import Envelope
from journal.models import Event
from projections.correlate import start_at_tip
from projections.declarations import lane, reaction
from projections.service import DrainService


def run(ctx) -> None:
    """Fast-lane latency while a slow reaction (100 ms a call) is busy: one lane vs two."""
    for layout in ("one lane", "two lanes"):
        pfx = streams.prefix(ctx.run_id, "lanes", layout.split()[0])
        slow_name, fast_name = f"bench-slow-{ctx.run_id}-{layout[:3]}", f"bench-fast-{ctx.run_id}-{layout[:3]}"
        fast_lane = "default" if layout == "one lane" else f"bench-fast-{ctx.run_id}"
        if layout == "two lanes":
            lane(fast_lane)
        samples: list[float] = []
        slow_done: list[int] = []
        reaction(slow_name, on=["BenchSlow"], atomic=False)(
            lambda e, t, done=slow_done: (time.sleep(0.1), done.append(1)))
        reaction(fast_name, on=["BenchFast"], atomic=False, lane=fast_lane)(
            lambda e, t, out=samples: out.append((time.time() - e.payload["t"]) * 1000))
        start_at_tip([slow_name, fast_name])
        overrides = {"LOOM_DRAIN_POLL_MS": 5} if ctx.vendor == "sqlite" else {}
        try:
            with override_settings(**overrides):
                service = DrainService()
                service.start()
                try:
                    for rnd in range(3):
                        Event.objects.append_batch([(f"{pfx}slow{i}", Envelope("BenchSlow")) for i in range(5)])
                        time.sleep(0.05)  # the slow lane is now busy in its handler
                        for i in range(50):
                            Event.objects.append(f"{pfx}fast{i}", Envelope("BenchFast", {"t": time.time()}))
                        wait(lambda r=rnd, out=samples, done=slow_done: len(out) >= 50 * (r + 1)
                              and len(done) >= 5 * (r + 1), 60)
                finally:
                    service.stop(10)
            ctx.verify(f"lanes {layout}: fast handled", 150, len(samples))
            ctx.record(f"fast lane, {layout}", {"slow_handler_ms": 100, "slow_events": 5, "fast_events": 50,
                                                "rounds": 3, "wakeup": wakeup(ctx)},
                       unit="ms", latencies_ms=samples, count=len(samples))
        finally:
            cleanup(ctx, [slow_name, fast_name], pfx)
