"""Section `coalesced`: the cross-stream coalescer against per-event appends, in the same run.

64 writers (`--coalesce-writers`), each on its own fenced stream, append one event per call:
- per-event: `Event.objects.append`, one statement (and one notifying commit) per event;
- ceiling: the same one-row statement through the raw driver (the one-row-per-transaction
  ceiling with notification);
- coalesced-16 / coalesced-64: `CoalescingAppender.append` with max_batch 16 and 64; its flush
  threads (LOOM_COALESCE_FLUSHERS, or `--coalesce-flushers`) own the only connections.
Also a single writer, per-event vs coalesced-16: with nobody to merge with, the coalescer can
only add a thread hand-off, which is its cost.

The variants are interleaved for `--repeats` rounds (rotating which goes first) and each cell
records its median; every round is verified against the rows it wrote.
"""

from __future__ import annotations

import statistics

from benchmarks import streams
from benchmarks.arguments import positive_int
from benchmarks.cells import raise_errors, tidy, verify_written
from benchmarks.harness import run_workers
from benchmarks.sections.append import _ceiling, connection_cap, payload, pooled
from journal import conf
from journal.coalesce import CoalescingAppender
from journal.envelopes import Envelope
from journal.models import Event

VARIANTS = ("per-event", "ceiling", "coalesced-16", "coalesced-64")
SINGLE = ("per-event", "coalesced-16")


def add_arguments(parser) -> None:
    parser.add_argument("--coalesce-writers", type=positive_int, default=64,
                        help="Writers of the coalesced section (64).")
    parser.add_argument("--coalesce-flushers", type=positive_int, default=None,
                        help="Flush threads per coalescer (default LOOM_COALESCE_FLUSHERS).")
    parser.add_argument("--repeats", type=positive_int, default=3,
                        help="Interleaved repeats of comparison sections; medians are recorded (default 3).")


def run(ctx) -> None:
    opts = ctx.options
    writers = opts["coalesce_writers"]
    ops = max(16, opts["ops"] // 4)  # 4 variants x repeats rounds: keep the default run short
    body = payload(opts["payload_bytes"])
    repeats = max(1, opts["repeats"])
    for conc, variants in ((writers, VARIANTS), (1, SINGLE)):
        samples: dict[str, list] = {v: [] for v in variants}
        for rep in range(repeats):
            order = variants[rep % len(variants):] + variants[:rep % len(variants)]
            for variant in order:
                samples[variant].append(_round(ctx, variant, conc, ops, body, rep))
        base = statistics.median(s["throughput"] for s in samples["per-event"])
        for variant in variants:
            cells = samples[variant]
            tput = statistics.median(c["throughput"] for c in cells)
            mid = sorted(cells, key=lambda c: c["throughput"])[len(cells) // 2]
            ctx.record(variant, {"writers": conc, "payload_bytes": opts["payload_bytes"], "repeats": repeats,
                                 "flushers": mid.get("flushers")},
                       throughput=tput, unit="events/s", latencies_ms=mid["latencies"],
                       count=sum(c["units"] for c in cells), verified_rows=sum(c["units"] for c in cells),
                       vs_per_event=round(tput / base, 3) if base else None,
                       rows_per_statement=mid.get("rows_per_statement"),
                       runs=[round(c["throughput"], 1) for c in cells])


def _round(ctx, variant: str, conc: int, ops: int, body: dict, rep: int) -> dict:
    pfx = streams.prefix(ctx.run_id, "coalesced", variant, conc, rep)
    ids = [f"{pfx}{w}" for w in range(conc)]
    for sid in ids:
        Event.objects.open_stream(sid, Envelope("BenchOpened"))
    env = Envelope("BenchEvent", body)
    appender = None
    extra: dict = {}
    if variant == "per-event":
        def op(w: int, i: int) -> int:
            Event.objects.append(ids[w], env, fence_token=1)
            return 1
        op, setup, teardown = pooled(op, connection_cap(ctx, conc))
    elif variant == "ceiling":
        op, setup, teardown = _ceiling(ctx, ids, body, connection_cap(ctx, conc))
    else:
        flushers = ctx.options.get("coalesce_flushers") or conf.get("LOOM_COALESCE_FLUSHERS")
        appender = CoalescingAppender(max_batch=int(variant.rsplit("-", 1)[1]), flushers=flushers)
        extra["flushers"] = flushers

        def op(w: int, i: int) -> int:
            appender.append(ids[w], env, fence_token=1)
            return 1
        setup = teardown = None
    bar = ctx.progress(conc * ops, f"{variant} c={conc} #{rep + 1}")
    try:
        outcome = run_workers(conc, ops, op, setup=setup, teardown=teardown, progress=bar.update)
    finally:
        bar.close()
        if appender is not None:
            appender.close()
    raise_errors(f"coalesced {variant} c={conc}", outcome.errors)
    verify_written(ctx, f"{variant} c={conc} round {rep + 1}", pfx, outcome.units, opened=conc)
    if appender is not None:  # no guard can fail here, so every request went through exactly once
        ctx.verify(f"{variant} c={conc} round {rep + 1} refused statements", 0, appender.retries)
        ctx.verify(f"{variant} c={conc} round {rep + 1} coalesced requests", outcome.units, appender.batched_requests)
        extra["rows_per_statement"] = round(appender.batched_requests / max(1, appender.statements), 2)
    tidy(ctx, pfx)
    return {"throughput": outcome.throughput, "latencies": outcome.latencies_ms, "units": outcome.units, **extra}

