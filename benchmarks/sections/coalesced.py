"""Section `coalesced`: the cross-stream coalescer against per-event appends, in the same run.

64 writers (`--coalesce-writers`), each on its own fenced stream, append one event per call:
- per-event: `Event.objects.append` with LOOM_COALESCE off, one statement (and one notifying
  commit) per event;
- ceiling: the same one-row statement through the raw driver (the one-row-per-transaction
  ceiling with notification);
- coalesced-16 / coalesced-64: `Coalescer.append` with max_batch 16 and 64; its flush
  threads (LOOM_COALESCE_FLUSHERS, or `--coalesce-flushers`) own the only connections.
- raw-coalescer: the ceiling of coalescing, a minimal coalescer in the raw driver (no Django, no
  validation, no envelopes): the same writers queue (stream, payload text) pairs, the same number of
  flush threads each with its own connection take up to 64 of them and run the SAME guarded
  multi-row APPEND statement (one pg_notify per statement) with its array parameters, prepared.
  Every coalesced cell records `vs_raw_coalescer` (its throughput over this one's: ours ÷ ceiling)
  and every cell `cpu_us_per_event`, this process's CPU time per event (steadier than throughput
  on a loaded machine).
- procs-1 / procs-2: the same writers through Loom's coalescer (max_batch 64) spread over 1 and over 2
  OS processes (64 threads in one child vs 32 in each of two), each child with its own coalescer and
  its own flush connections: the real deployment, several worker processes. The children (on the
  run's database, benchmarks/children.py) connect and warm up (one append per writer), then are
  released together by closing a pipe they all wait on; throughput is the rows written over the
  window from the earliest child's start to the latest child's end. procs-2 records `vs_procs_1`.
  On SQLite both run against the one database file: the processes serialize on its write lock.
Also a single writer, per-event vs coalesced-16: with nobody to merge with, the adaptive
coalescer writes the caller's request itself, so the two should be equal (goal: >= 0.95).

The variants are interleaved for `--repeats` rounds (rotating which goes first) and each cell
records its median; every round is verified against the rows it wrote.
"""

from __future__ import annotations

import json
import os
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from collections import deque
from contextlib import nullcontext

from django.db import connection, connections

from benchmarks import streams
from benchmarks.arguments import positive_int
from benchmarks.cells import open_streams, raise_errors, tidy, verify_written
from benchmarks.children import ROOT, child_env
from benchmarks.harness import run_workers
from benchmarks.sections.append import _ceiling, connection_cap, direct, payload, pooled
from journal import conf
from journal.coalesce import Coalescer
from journal.envelopes import Envelope
from journal.models import Event
from journal.store import sqlite as q

VARIANTS = ("per-event", "ceiling", "raw-coalescer", "coalesced-16", "coalesced-64", "procs-1", "procs-2")
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
    ops = max(16, opts["ops"] // 4)  # 7 variants x repeats rounds: keep the default run short
    body = payload(opts["payload_bytes"])
    repeats = max(1, opts["repeats"])
    for conc, variants in ((writers, VARIANTS), (1, SINGLE)):
        samples: dict[str, list] = {v: [] for v in variants}
        for rep in range(repeats):
            order = variants[rep % len(variants):] + variants[:rep % len(variants)]
            for variant in order:
                measure = _procs_round if variant.startswith("procs-") else _round
                samples[variant].append(measure(ctx, variant, conc, ops, body, rep))
        base = statistics.median(s["throughput"] for s in samples["per-event"])
        raw = statistics.median(s["throughput"] for s in samples["raw-coalescer"]) if "raw-coalescer" in samples \
            else None
        procs_1 = statistics.median(s["throughput"] for s in samples["procs-1"]) if "procs-1" in samples else None
        for variant in variants:
            cells = samples[variant]
            tput = statistics.median(c["throughput"] for c in cells)
            mid = sorted(cells, key=lambda c: c["throughput"])[len(cells) // 2]
            procs = {"processes": mid["processes"]} if variant.startswith("procs-") else {}
            ctx.record(variant, {"writers": conc, "payload_bytes": opts["payload_bytes"], "repeats": repeats,
                                 "flushers": mid.get("flushers"), **procs},
                       throughput=tput, unit="events/s", latencies_ms=mid["latencies"],
                       count=sum(c["units"] for c in cells), verified_rows=sum(c["units"] for c in cells),
                       vs_per_event=round(tput / base, 3) if base else None,
                       vs_raw_coalescer=round(tput / raw, 3) if raw else None,
                       **({"vs_procs_1": round(tput / procs_1, 3) if procs_1 else None} if variant == "procs-2"
                          else {}),
                       rows_per_statement=mid.get("rows_per_statement"),
                       **({"connections_opened": mid["connections"]} if variant.startswith("procs-") else {}),
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
        appender = Coalescer(max_batch=int(variant.rsplit("-", 1)[1]), flushers=flushers)
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
        ctx.verify(f"{variant} c={conc} round {rep + 1} coalesced requests", outcome.units, written_once(appender))
        extra["rows_per_statement"] = round(appender.batched_requests / max(1, appender.statements), 2)
    tidy(ctx, pfx)
    # This process's CPU time per event (every thread: writers, flush threads, driver): what our code
    # costs, steadier than throughput on a loaded machine (it does not count waiting for the server).
    extra["cpu_us_per_event"] = round(cpu * 1e6 / max(1, outcome.units), 1)
    return {"throughput": outcome.throughput, "latencies": outcome.latencies_ms, "units": outcome.units, **extra}


def written_once(appender) -> int:
    """The requests a coalescer wrote exactly once: those of its committed statements (a statement rolled
    back on a lock timeout counted its requests before they were re-sent) and those it handed back to
    their callers, who wrote them directly."""
    return appender.batched_requests - appender.timed_out + appender.fallbacks


def _procs_round(ctx, variant: str, conc: int, ops: int, body: dict, rep: int) -> dict:
    """The `conc` writers spread over N child processes (`procs-N`), each with its own coalescer.

    The children connect and warm up, say `ready`, then all wait on one pipe; closing its write end
    releases them at once (every reader sees end-of-file together), so each shape is timed over the
    same kind of window: the earliest child's start to the latest child's end, on the machine's clock."""
    nprocs = int(variant.rsplit("-", 1)[1])
    pfx = streams.prefix(ctx.run_id, "coalesced", variant, conc, rep)
    open_streams(pfx, conc)
    flushers = ctx.options.get("coalesce_flushers") or conf.get("LOOM_COALESCE_FLUSHERS")
    shares = [share for k in range(nprocs) if (share := conc // nprocs + (k < conc % nprocs))]
    release_r, release_w = os.pipe()
    children: list[subprocess.Popen] = []
    bar = ctx.progress(conc * ops, f"{variant} c={conc} #{rep + 1}")
    try:
        first = 0
        for share in shares:  # all started before any is waited for: they set up side by side
            children.append(_spawn_writers(pfx, first, share, ops, flushers, body, release_r))
            first += share
        os.close(release_r)
        release_r = -1
        for child in children:  # connected, warmed up, waiting on the pipe
            line = child.stdout.readline().strip()
            if line != "ready":
                raise RuntimeError(f"coalesced {variant}: a writer process did not start: {line} "
                                   f"{child.stderr.read()[-2000:]}")
        os.close(release_w)  # the barrier: every child's read returns now
        release_w = -1
        reports = []
        for child in children:
            out, err = child.communicate(timeout=600)
            if child.returncode != 0:
                raise RuntimeError(f"coalesced {variant}: a writer process failed ({child.returncode}): {err[-2000:]}")
            reports.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for fd in (release_r, release_w):
            if fd >= 0:
                os.close(fd)
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    raise_errors(f"coalesced {variant} c={conc}", [e for r in reports for e in r["errors"]])
    units = sum(r["units"] for r in reports)
    bar.update(units)
    bar.close()
    label = f"{variant} c={conc} round {rep + 1}"
    # The rows under the prefix: one opening and one warm-up append per writer, then the timed appends.
    written = verify_written(ctx, label, pfx, units, opened=conc + sum(r["warmed"] for r in reports))
    ctx.verify(f"{label} refused statements", 0, sum(r["retries"] for r in reports))
    ctx.verify(f"{label} coalesced requests", units, sum(r["written_once"] for r in reports))
    tidy(ctx, pfx)
    window = max(r["end"] for r in reports) - min(r["start"] for r in reports)
    statements = sum(r["statements"] for r in reports)
    return {"throughput": written / window if window > 0 else 0.0, "units": units, "processes": len(reports),
            "latencies": [ms for r in reports for ms in r["latencies"]], "flushers": flushers,
            "rows_per_statement": round(units / max(1, statements), 2),
            "connections": sum(r["connections"] for r in reports),
            # Every child's CPU time over its timed window (writers, flush threads, driver), per event.
            "cpu_us_per_event": round(sum(r["cpu_s"] for r in reports) * 1e6 / max(1, units), 1)}


def _spawn_writers(pfx: str, first: int, count: int, ops: int, flushers: int, body: dict,
                   release_fd: int) -> subprocess.Popen:
    # The children write to the database this run writes to (benchmarks/children.py), not DATABASE_URL's.
    args = (pfx, first, count, ops, flushers, json.dumps(body), release_fd)
    code = ("import django; django.setup()\nfrom benchmarks.sections.coalesced import writer_process\n"
            f"writer_process(*{args!r})\n")
    return subprocess.Popen([sys.executable, "-c", code], env=child_env(), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, pass_fds=(release_fd,))


def writer_process(pfx: str, first: int, count: int, ops: int, flushers: int, body: str, release_fd: int) -> None:
    """A child of the procs-N cells: `count` writer threads (streams pfx{first}..) through this process's own
    coalescer (max_batch 64, `flushers` flush connections). Each writer appends once to warm up (its thread,
    the flush threads' connections), then the process says `ready` and waits for the pipe to close; the timed
    appends follow. Prints one JSON line: the window's start and end (time.time(), comparable between
    processes), the appends, their latencies, the coalescer's counters for the timed window, CPU seconds."""
    from django.db.backends.signals import connection_created

    opened = [0]  # connections this process opened: flush threads' and lone callers' (the adaptive path)

    def opening(sender, **kwargs) -> None:
        opened[0] += 1
    connection_created.connect(opening, weak=False)
    env = Envelope("BenchEvent", json.loads(body))
    appender = Coalescer(max_batch=64, flushers=flushers)
    warmed = threading.Barrier(count + 1)
    go = threading.Event()
    lock = threading.Lock()
    latencies: list[float] = []
    errors: list[str] = []
    done = [0, 0]  # warm-up appends, timed appends

    def writer(w: int) -> None:
        sid, mine, units = f"{pfx}{first + w}", [], 0
        try:
            try:
                appender.append(sid, env, fence_token=1)
                with lock:
                    done[0] += 1
            finally:
                warmed.wait()
            go.wait()
            for _ in range(ops):
                began = time.perf_counter()
                appender.append(sid, env, fence_token=1)
                mine.append(round((time.perf_counter() - began) * 1000, 3))
                units += 1
        except Exception as exc:  # reported, then the cell fails loudly
            with lock:
                errors.append(f"writer {first + w}: {type(exc).__name__}: {exc}")
        finally:
            connections.close_all()
            with lock:
                latencies.extend(mine)
                done[1] += units

    threads = [threading.Thread(target=writer, args=(w,), daemon=True) for w in range(count)]
    for thread in threads:
        thread.start()
    warmed.wait()
    before = (appender.statements, appender.batched_requests, appender.retries, written_once(appender))
    print("ready", flush=True)
    while os.read(release_fd, 1):  # end-of-file: the parent released every child at once
        pass
    start, cpu = time.time(), time.process_time()
    go.set()
    for thread in threads:
        thread.join()
    end, cpu = time.time(), time.process_time() - cpu
    appender.close()
    print(json.dumps({"start": start, "end": end, "units": done[1], "warmed": done[0], "latencies": latencies,
                      "errors": errors, "statements": appender.statements - before[0],
                      "batched_requests": appender.batched_requests - before[1],
                      "retries": appender.retries - before[2], "written_once": written_once(appender) - before[3],
                      "cpu_s": cpu, "connections": opened[0]}), flush=True)



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

            from journal.store.postgres import PLAN_CACHE_MODE, PostgresStore, binary_arrays

            conn = psycopg.connect(host=settings["HOST"] or "127.0.0.1", port=settings["PORT"] or 5432,
                                   dbname=settings["NAME"], user=settings["USER"] or None,
                                   password=settings["PASSWORD"] or None, autocommit=True)
            conn.execute(PLAN_CACHE_MODE)  # as the journal's connections run their prepared statements
            # The text the journal sends where it binds on the server: binary array parameters.
            sql = binary_arrays(PostgresStore("default").append_sql())
            channel = conf.get("LOOM_NOTIFY_CHANNEL")

            def write(sids: list[str]) -> None:
                n = len(sids)
                rows = conn.execute(sql, {"sids": sids, "tokens": [1] * n, "expected": [None] * n, "rsids": sids,
                                          "ords": [0] * n, "types": ["BenchEvent"] * n, "payloads": [text] * n,
                                          "channel": channel}, prepare=True).fetchall()
                if not all(row[2] for row in rows):
                    raise RuntimeError("raw-coalescer: fence refused")
            return write, conn

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
