"""Section `batch-shape`: one stream's events per statement, in batches of 1, 4, 16 and 64.

`--batch-writers` writers (default 8), each appending `--ops` events to its own fenced stream in
calls of b events (one `append_batch` item of b envelopes, one guard, one notification). The same
events in fewer, larger statements: what the statement shape is worth before any coalescing.
Events per second and statements per second are both recorded, with the ratio to b = 1.
"""

from __future__ import annotations

from benchmarks import streams
from benchmarks.arguments import positive_int
from benchmarks.cells import drive, open_streams, verify_written
from benchmarks.sections.append import connection_cap, payload, pooled
from journal.envelopes import AppendItem, Envelope
from journal.models import Event

SIZES = (1, 4, 16, 64)


def add_arguments(parser) -> None:
    parser.add_argument("--batch-writers", type=positive_int, default=8, help="Writers of the batch-shape section (8).")


def run(ctx) -> None:
    opts = ctx.options
    writers = opts["batch_writers"]
    events = max(64, opts["ops"] // 64 * 64)  # every size divides the per-writer total
    body = payload(opts["payload_bytes"])
    base = None
    for size in SIZES:
        pfx = streams.prefix(ctx.run_id, "batch-shape", size)
        ids = open_streams(pfx, writers)
        envs = tuple([Envelope("BenchEvent", body)] * size)

        def op(w: int, i: int, ids=ids, envs=envs, size=size) -> int:
            Event.objects.append_batch([AppendItem(ids[w], envs, 1, None)])
            return size
        op, setup, teardown = pooled(op, connection_cap(ctx, writers))
        outcome = drive(ctx, f"batch {size}", writers, events // size, op, per_call=size, setup=setup,
                        teardown=teardown)
        written = verify_written(ctx, f"batch {size}", pfx, outcome.units, opened=writers)
        base = base or outcome.throughput
        ctx.record(f"batch-{size}", {"writers": writers, "events_per_statement": size,
                                     "payload_bytes": opts["payload_bytes"]},
                   throughput=outcome.throughput, unit="events/s", latencies_ms=outcome.latencies_ms,
                   count=outcome.units, verified_rows=written,
                   statements_per_s=round(outcome.throughput / size, 1),
                   vs_batch_1=round(outcome.throughput / base, 3) if base else None)
        if not opts.get("keep"):
            streams.remove(pfx)
