"""Section `read`: loading the state of a 4-event and a 102-event execution, snapshots on.

With LOOM_SNAPSHOT_EVERY=2 the settle-time checkpoint lands at the tip, so `load_state` reads the
newest snapshot and an empty tail whatever the log length: the long log should cost at most 1.3x
the short one (what remains is the bigger snapshot state to fetch and parse). N threads load
repeatedly; p50 and reads/s per log length, and the p50 ratio long/short.
"""

from __future__ import annotations

from django.test.utils import override_settings

from benchmarks import streams
from benchmarks.harness import run_workers
from benchmarks.sections.durable import remove_headers
from journal.flows import flow, load_state, start


@flow("bench.chain")
def chain(ctx, value):
    for i in range(value["n"]):
        ctx.step(f"s{i}", _noop)
    return value["n"]


def _noop() -> int:
    return 1


def add_arguments(parser) -> None:
    parser.add_argument("--read-concurrency", type=int, default=16, help="Threads of the read section (default 16).")
    parser.add_argument("--read-ops", type=int, default=300, help="Loads per thread per log length (default 300).")


def run(ctx) -> None:
    pfx = streams.prefix(ctx.run_id, "read")
    conc, ops = ctx.options["read_concurrency"], ctx.options["read_ops"]
    p50 = {}
    with override_settings(LOOM_SNAPSHOT_EVERY=2):
        for steps, events in ((1, 4), (50, 102)):
            eid = f"{pfx}{events}"
            start("bench.chain", {"n": steps}, execution_id=eid)
            state = load_state(eid)
            ctx.verify(f"{events}-event log length", events - 1, state.seq)
            ctx.verify(f"{events}-event snapshot at the tip", state.seq, state.snapshot_seq)
            bar = ctx.progress(conc * ops, f"{events} events")

            def op(w: int, i: int, eid=eid, tip=events - 1) -> int:
                if load_state(eid).seq != tip:
                    raise RuntimeError(f"{eid}: load_state returned another tip")
                return 1

            outcome = run_workers(conc, ops, op, progress=bar.update)
            bar.close()
            if outcome.errors:
                raise RuntimeError(f"read {events}: {outcome.errors[:3]}")
            result = ctx.record(f"{events}-event", {"events": events, "steps": steps, "snapshot_every": 2,
                                                    "concurrency": conc},
                                throughput=outcome.throughput, unit="reads/s", latencies_ms=outcome.latencies_ms,
                                count=outcome.units, queries_per_read=2, tail_rows=0)
            p50[events] = result.p50_ms
    ctx.record("long/short p50", {"long": 102, "short": 4}, throughput=None, unit="ratio",
               ratio=round(p50[102] / p50[4], 3) if p50[4] else None)
    if not ctx.options.get("keep"):
        streams.remove(pfx)
        remove_headers(pfx)
