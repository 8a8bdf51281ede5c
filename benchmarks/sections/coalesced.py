"""Section `coalesced`: the cross-stream coalescer against per-event appends, in the same run.

64 writers (`--coalesce-writers`), each on its own fenced stream, append one event per call:
- per-event: `Event.objects.append` with LOOM_COALESCE off, one statement (and one notifying
  commit) per event;
- ceiling: the same one-row statement through the raw driver (the one-row-per-transaction
  ceiling with notification);
- coalesced-16 / coalesced-64: `CoalescingAppender.append` with max_batch 16 and 64; its flush
  threads (LOOM_COALESCE_FLUSHERS, or `--coalesce-flushers`) own the only connections.
- raw-coalescer: the ceiling of coalescing, a minimal coalescer in the raw driver (no Django, no
  validation, no envelopes): the same writers queue (stream, payload text) pairs, the same number of
  flush threads each with its own connection take up to 64 of them and run the SAME guarded
  multi-row APPEND statement (one pg_notify per statement) with its array parameters, prepared.
  Every coalesced cell records `vs_raw_coalescer` (its throughput over this one's: ours ÷ ceiling)
  and every cell `cpu_us_per_event`, this process's CPU time per event (steadier than throughput
  on a loaded machine).
Also a single writer, per-event vs coalesced-16: with nobody to merge with, the adaptive
coalescer writes the caller's request itself, so the two should be equal (goal: >= 0.95).

The variants are interleaved for `--repeats` rounds (rotating which goes first) and each cell
records its median; every round is verified against the rows it wrote.
"""

from __future__ import annotations

import json
import sqlite3
import statistics
import threading
import time
from collections import deque
from contextlib import nullcontext

from django.db import connection

from benchmarks import streams
from benchmarks.arguments import positive_int
from benchmarks.cells import raise_errors, tidy, verify_written
from benchmarks.harness import run_workers
from benchmarks.sections.append import _ceiling, connection_cap, direct, payload, pooled
from journal import conf
from journal.coalesce import CoalescingAppender
from journal.envelopes import Envelope
from journal.models import Event

VARIANTS = ("per-event", "ceiling", "raw-coalescer", "coalesced-16", "coalesced-64")
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
        raw = statistics.median(s["throughput"] for s in samples["raw-coalescer"]) if "raw-coalescer" in samples \
            else None
        for variant in variants:
            cells = samples[variant]
            tput = statistics.median(c["throughput"] for c in cells)
            mid = sorted(cells, key=lambda c: c["throughput"])[len(cells) // 2]
            ctx.record(variant, {"writers": conc, "payload_bytes": opts["payload_bytes"], "repeats": repeats,
                                 "flushers": mid.get("flushers")},
                       throughput=tput, unit="events/s", latencies_ms=mid["latencies"],
                       count=sum(c["units"] for c in cells), verified_rows=sum(c["units"] for c in cells),
                       vs_per_event=round(tput / base, 3) if base else None,
                       vs_raw_coalescer=round(tput / raw, 3) if raw else None,
                       rows_per_statement=mid.get("rows_per_statement"),
                       cpu_us_per_event=statistics.median(c["cpu_us_per_event"] for c in cells),
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
    elif variant == "raw-coalescer":
        flushers = ctx.options.get("coalesce_flushers") or conf.get("LOOM_COALESCE_FLUSHERS")
        appender = RawCoalescer(ctx.vendor, json.dumps(body, separators=(",", ":")), flushers)
        extra["flushers"] = flushers

        def op(w: int, i: int) -> int:
            appender.append(ids[w])
            return 1
        setup = teardown = None
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
        cpu = time.process_time()
        with direct() if variant == "per-event" else nullcontext():
            outcome = run_workers(conc, ops, op, setup=setup, teardown=teardown, progress=bar.update)
        cpu = time.process_time() - cpu
    finally:
        bar.close()
        if appender is not None:
            appender.close()
    raise_errors(f"coalesced {variant} c={conc}", outcome.errors)
    verify_written(ctx, f"{variant} c={conc} round {rep + 1}", pfx, outcome.units, opened=conc)
    if isinstance(appender, RawCoalescer):
        ctx.verify(f"{variant} c={conc} round {rep + 1} coalesced requests", outcome.units, appender.requests)
        extra["rows_per_statement"] = round(appender.requests / max(1, appender.statements), 2)
    elif appender is not None:  # no guard can fail here, so every request went through exactly once
        ctx.verify(f"{variant} c={conc} round {rep + 1} refused statements", 0, appender.retries)
        ctx.verify(f"{variant} c={conc} round {rep + 1} coalesced requests", outcome.units, appender.batched_requests)
        extra["rows_per_statement"] = round(appender.batched_requests / max(1, appender.statements), 2)
    tidy(ctx, pfx)
    # This process's CPU time per event (every thread: writers, flush threads, driver): what our code
    # costs, steadier than throughput on a loaded machine (it does not count waiting for the server).
    extra["cpu_us_per_event"] = round(cpu * 1e6 / max(1, outcome.units), 1)
    return {"throughput": outcome.throughput, "latencies": outcome.latencies_ms, "units": outcome.units, **extra}



class RawCoalescer:
    """The ceiling row: a minimal coalescer in the raw driver, doing what ours does minus our code.

    Callers queue (stream, waiter); `flushers` threads, each with its own connection, take up to
    `max_batch` waiting requests and run the journal's guarded multi-stream APPEND (PostgreSQL: the
    one statement with its arrays and one pg_notify, prepared; SQLite: the same BEGIN IMMEDIATE,
    guard reads, one multi-row INSERT, COMMIT), then wake their callers. Every writer has its own
    stream and one request in flight, so a batch never holds a stream twice.
    """

    def __init__(self, vendor: str, text: str, flushers: int, max_batch: int = 64):
        self.vendor, self.text, self.max_batch = vendor, text, max_batch
        self.pending: deque = deque()
        self.cond = threading.Condition()
        self.closed = False
        self.statements = self.requests = 0
        self.settings = connection.settings_dict
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(flushers)]
        for thread in self.threads:
            thread.start()

    def append(self, sid: str) -> None:
        waiter = [sid, threading.Event(), None]
        with self.cond:
            self.pending.append(waiter)
            self.cond.notify()
        waiter[1].wait()
        if waiter[2] is not None:
            raise waiter[2]

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        for thread in self.threads:
            thread.join(10)

    def _run(self) -> None:
        write, conn = self._writer()
        try:
            while True:
                with self.cond:
                    while not self.pending:
                        if self.closed:
                            return
                        self.cond.wait()
                    batch = [self.pending.popleft() for _ in range(min(self.max_batch, len(self.pending)))]
                    self.statements += 1
                    self.requests += len(batch)
                try:
                    write([w[0] for w in batch])
                except Exception as exc:  # the cell fails loudly
                    for waiter in batch:
                        waiter[2] = exc
                for waiter in batch:
                    waiter[1].set()
        finally:
            conn.close()

    def _writer(self):
        """(write(sids), connection) for this vendor: the journal's own statement, raw."""
        settings, text = self.settings, self.text
        if self.vendor == "postgresql":
            import psycopg

            from journal.store.postgres import PLAN_CACHE_MODE, PostgresStore

            conn = psycopg.connect(host=settings["HOST"] or "127.0.0.1", port=settings["PORT"] or 5432,
                                   dbname=settings["NAME"], user=settings["USER"] or None,
                                   password=settings["PASSWORD"] or None, autocommit=True)
            conn.execute(PLAN_CACHE_MODE)  # as the journal's connections run their prepared statements
            sql = PostgresStore("default").append_sql()
            channel = conf.get("LOOM_NOTIFY_CHANNEL")

            def write(sids: list[str]) -> None:
                n = len(sids)
                rows = conn.execute(sql, {"sids": sids, "tokens": [1] * n, "expected": [None] * n, "rsids": sids,
                                          "ords": [0] * n, "types": ["BenchEvent"] * n, "payloads": [text] * n,
                                          "channel": channel}, prepare=True).fetchall()
                if not all(row[2] for row in rows):
                    raise RuntimeError("raw-coalescer: fence refused")
            return write, conn

        from journal.store import sqlite as q

        conn = sqlite3.connect(settings["NAME"], timeout=30, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")

        def write(sids: list[str]) -> None:
            marks = ", ".join("?" * len(sids))
            conn.execute("BEGIN IMMEDIATE")
            try:
                tokens = dict(conn.execute(q.FENCES.format(marks=marks), sids).fetchall())
                tips = dict(conn.execute(q.TIPS.format(marks=marks), sids).fetchall())
                if any(tokens.get(sid) != 1 for sid in sids):
                    raise RuntimeError("raw-coalescer: fence refused")
                values = [v for sid in sorted(sids)
                          for v in (sid, tips[sid] + 1, "BenchEvent", text, "2026-01-01 00:00:00")]
                conn.execute(q.INSERT.format(rows=", ".join(["(?, ?, ?, ?, ?)"] * len(sids))), values)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        return write, conn
