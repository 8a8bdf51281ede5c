"""Section `contention` of bench_reactions: W drain workers claiming S streams."""

from __future__ import annotations

import threading
import time

from benchmarks import streams
from benchmarks.arguments import positive_int_list
from benchmarks.cells import raise_errors
from benchmarks.harness import run_workers
from benchmarks.sections.reactions.support import cleanup
from journal.envelopes import Envelope
from journal.models import Event
from projections.correlate import correlate, start_at_tip
from projections.declarations import reaction, registry
from projections.drain import DrainController
from projections.models import Subscription


def add_arguments(parser) -> None:
    parser.add_argument("--workers", type=positive_int_list, default="1,3,5", help="Claim contention worker counts.")
    parser.add_argument("--streams", type=positive_int_list, default="100,500", help="Claim contention stream counts.")


def run(ctx) -> None:
    """W workers drain S streams of 5 events each: streams/s and cycles that found nothing."""
    for s in ctx.options["streams"]:
        for w in ctx.options["workers"]:
            pfx = streams.prefix(ctx.run_id, "claim", w, s)
            name = f"bench-claim-{ctx.run_id}-{w}-{s}"
            seen: set[str] = set()
            lock = threading.Lock()

            def handle(event, target, seen=seen, lock=lock):
                with lock:
                    seen.add(event.stream_id)

            start_at_tip([name])
            reaction(name, on=["BenchClaim"], atomic=False)(handle)
            try:
                Event.objects.append_batch([(f"{pfx}{i}", [Envelope("BenchClaim")] * 5) for i in range(s)])
                correlate(registry)
                counts = {"cycles": 0, "empty": 0}
                controllers = {}

                def op(worker: int, i: int, s=s, seen=seen, counts=counts, controllers=controllers,
                       lock=lock) -> int:
                    c = controllers.setdefault(worker, DrainController(registry, registry.lanes["default"],
                                                                       f"bench-{worker}"))
                    while True:
                        result = c.cycle()
                        with lock:
                            counts["cycles"] += 1
                            counts["empty"] += result.claimed == 0
                            done = len(seen) >= s
                        if done:
                            return 0
                        if result.claimed == 0:
                            time.sleep(0.001)

                outcome = run_workers(w, 1, op)
                raise_errors("contention", outcome.errors)
                acked = Subscription.objects.filter(consumer=name, at=4).count()
                ctx.verify(f"contention {w}x{s}: streams acked", s, acked)
                ctx.record("claim", {"workers": w, "streams": s, "events_per_stream": 5},
                           throughput=s / outcome.wall_s, unit="streams/s", count=s,
                           cycles=counts["cycles"], empty_cycles=counts["empty"],
                           waste_pct=round(100 * counts["empty"] / max(1, counts["cycles"]), 1),
                           wall_s=round(outcome.wall_s, 4))
            finally:
                cleanup(ctx, [name], pfx)
