"""Section `notify` (PostgreSQL): what notifications and idle listeners cost the writer.

`--notify-writers` writers (default 32) append one event per call to their own fenced streams:
- silent: LOOM_NOTIFY off, the append statement without its pg_notify;
- notify, K = 0, 4, 16: the shipped statement with K idle LISTEN connections open on the
  journal's channel. They read nothing while the writers run (the server queues for them);
  afterwards each one's notifications are counted: one per append statement, or the cell fails.
Repeats are interleaved (rotating order) and medians recorded, with the ratio to silent.
"""

from __future__ import annotations

import json
import statistics

from django.db import connection
from django.test import override_settings

from benchmarks import streams
from benchmarks.arguments import positive_int
from benchmarks.cells import raise_errors, tidy, verify_written
from benchmarks.harness import run_workers
from benchmarks.sections.append import connection_cap, payload, pooled
from journal import conf
from journal.envelopes import Envelope
from journal.models import Event

CELLS = (("silent", 0), ("notify", 0), ("notify", 4), ("notify", 16))


def add_arguments(parser) -> None:
    parser.add_argument("--notify-writers", type=positive_int, default=32, help="Writers of notify and fanout (32).")


def connect():
    """A raw psycopg connection to the benchmark's database (listeners, subscribers)."""
    import psycopg

    s = connection.settings_dict
    return psycopg.connect(host=s["HOST"] or "127.0.0.1", port=s["PORT"] or 5432, dbname=s["NAME"],
                           user=s["USER"] or None, password=s["PASSWORD"] or None, autocommit=True)


def tips_of(payload_text: str) -> dict:
    try:
        return json.loads(payload_text).get("tips") or {}
    except ValueError:
        return {}


def run(ctx) -> None:
    if ctx.vendor != "postgresql":
        ctx.skip("notifications and LISTEN exist only on PostgreSQL")
        return
    opts = ctx.options
    writers, ops = opts["notify_writers"], max(16, opts["ops"] // 2)
    body = payload(opts["payload_bytes"])
    repeats = max(1, opts["repeats"])
    samples: dict[tuple, list] = {cell: [] for cell in CELLS}
    for rep in range(repeats):
        order = CELLS[rep % len(CELLS):] + CELLS[:rep % len(CELLS)]
        for cell in order:
            samples[cell].append(_round(ctx, cell, writers, ops, body, rep))
    base = statistics.median(s["throughput"] for s in samples[("silent", 0)])
    for (variant, listeners), cells in samples.items():
        tput = statistics.median(c["throughput"] for c in cells)
        mid = sorted(cells, key=lambda c: c["throughput"])[len(cells) // 2]
        ctx.record(f"{variant} K={listeners}", {"writers": writers, "listeners": listeners, "repeats": repeats},
                   throughput=tput, unit="events/s", latencies_ms=mid["latencies"],
                   count=sum(c["units"] for c in cells), verified_rows=sum(c["units"] for c in cells),
                   vs_silent=round(tput / base, 3) if base else None,
                   notifications_per_listener_per_event=mid["per_listener"],
                   runs=[round(c["throughput"], 1) for c in cells])


def _round(ctx, cell: tuple, writers: int, ops: int, body: dict, rep: int) -> dict:
    variant, k = cell
    pfx = streams.prefix(ctx.run_id, "notify", variant, k, rep)
    ids = [f"{pfx}{w}" for w in range(writers)]
    for sid in ids:
        Event.objects.open_stream(sid, Envelope("BenchOpened"))
    channel = conf.get("LOOM_NOTIFY_CHANNEL")
    listeners = [connect() for _ in range(k)]
    for conn in listeners:
        conn.execute(f'LISTEN "{channel}"')
    env = Envelope("BenchEvent", body)

    def op(w: int, i: int) -> int:
        Event.objects.append(ids[w], env, fence_token=1)
        return 1
    op, setup, teardown = pooled(op, connection_cap(ctx, writers))
    bar = ctx.progress(writers * ops, f"{variant} K={k} #{rep + 1}")
    try:
        # Coalescing off: the cell prices one append statement (and its one notification) per append; the
        # coalescer (on by default) would merge concurrent appends into fewer statements and notifications.
        with override_settings(LOOM_NOTIFY=(variant == "notify"), LOOM_COALESCE=False):
            outcome = run_workers(writers, ops, op, setup=setup, teardown=teardown, progress=bar.update)
        bar.close()
        raise_errors(f"notify {variant} K={k}", outcome.errors)
        counts = [_drain(conn, pfx, outcome.units) for conn in listeners]
    finally:
        for conn in listeners:
            conn.close()
    verify_written(ctx, f"{variant} K={k} round {rep + 1}", pfx, outcome.units, opened=writers)
    for n, count in enumerate(counts):  # one notification per append statement, to every listener
        ctx.verify(f"{variant} K={k} round {rep + 1} listener {n} notifications", outcome.units, count)
    tidy(ctx, pfx)
    per_listener = round(statistics.mean(counts) / outcome.units, 3) if counts else None
    return {"throughput": outcome.throughput, "latencies": outcome.latencies_ms, "units": outcome.units,
            "per_listener": per_listener}


def _drain(conn, pfx: str, expected: int) -> int:
    """Notifications about this round's streams that an idle listener had queued."""
    count = 0
    for note in conn.notifies(timeout=15, stop_after=expected):
        if any(sid.startswith(pfx) for sid in tips_of(note.payload)):
            count += 1
    return count
