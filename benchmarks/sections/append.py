"""Section `append`: N concurrent writers, each on its own fenced stream.

Four variants in the same run, so that our overhead is a ratio and not a guess:
- per-event: `Event.objects.append` of one event per call, direct (LOOM_COALESCE off: one statement
  per event; the coalescer, on by default, is measured by the `coalesced` section);
- batch: `append_batch` with 16 events of the writer's stream per call;
- ceiling: the very statement of the per-event append, issued with the raw driver (psycopg or
  sqlite3), no Django, parameters prepared once. On PostgreSQL that is the fenced INSERT with its
  pg_notify; on SQLite the same BEGIN IMMEDIATE / guard reads / INSERT / COMMIT sequence.
- minimal: the least a fenced, notified append can be (`MINIMAL_APPEND` of the journal store):
  the fence check, one INSERT at a seq the writer tracks itself, one pg_notify, in one statement,
  through the raw driver; the floor under `ceiling` (which is our own, verdict-returning statement).
Recorded beside each cell: `vs_minimal` and `vs_ceiling` (this cell's throughput over theirs: ours
÷ ceiling), so every run shows our overhead as ratios.

Concurrency: default 1,8,32,64 (the main job's default run stays short on SQLite); `--full`
sweeps 1,8,32,64,128,256, or pass `--concurrency`. PostgreSQL allows only so many connections
(100 here), so on PostgreSQL writers beyond `--pg-connections` (default 32) share that many
connections, each writer borrowing one per call, as an application server's pool would: the
concurrency is then in-flight appends, and the extra writers queue for a connection.
"""

from __future__ import annotations

import json
import queue
import sqlite3
import statistics
import threading
from contextlib import nullcontext

from django.db import connection, connections

from benchmarks import streams
from benchmarks.arguments import non_negative_int, positive_int, positive_int_list
from benchmarks.cells import drive, open_streams, tidy, verify_written
from benchmarks.stats import latency_summary
from journal import conf
from journal.envelopes import AppendItem, Envelope
from journal.models import Event

BATCH = 16


DEFAULT_CONCURRENCY = "1,8,32,64"
FULL_CONCURRENCY = "1,8,32,64,128,256"


def add_arguments(parser) -> None:
    parser.add_argument("--concurrency", type=positive_int_list, default=None,
                        help=f"Comma-separated writer counts for the append section (default {DEFAULT_CONCURRENCY};"
                             f" --full: {FULL_CONCURRENCY}).")
    parser.add_argument("--full", action="store_true",
                        help="Longer sweeps: append up to 256 writers, executions up to 2048.")
    parser.add_argument("--ops", type=positive_int, default=400, help="Events per writer per cell (default 400).")
    parser.add_argument("--payload-bytes", type=non_negative_int, default=256,
                        help="JSON payload size per event (default 256).")
    parser.add_argument("--append-repeats", type=positive_int, default=1,
                        help="Interleaved repeats of each append cell, rotating the variants' order; medians"
                             " are recorded (default 1).")
    parser.add_argument("--pg-connections", type=positive_int, default=32,
                        help="On PostgreSQL, most connections the direct writers of a cell open (default 32).")


def concurrencies(options: dict) -> list[int]:
    """Writer counts: `--concurrency` (checked when parsed), else the default or `--full` sweep."""
    chosen = options.get("concurrency")
    return list(chosen) if chosen else positive_int_list(FULL_CONCURRENCY if options.get("full") else
                                                         DEFAULT_CONCURRENCY)


def payload(size: int) -> dict:
    """A payload whose JSON encoding is `size` bytes (at least the envelope's own braces)."""
    base = len(json.dumps({"data": ""}, separators=(",", ":")))
    return {"data": "x" * max(0, size - base)}


VARIANTS = ("per-event", "batch", "ceiling", "minimal")


def run(ctx) -> None:
    """Each concurrency: the three variants, `--append-repeats` times in a rotating order (so no
    variant always runs first, on a cold cache, or last); recorded: median throughput, pooled
    latencies, and the ceiling's median over each variant's (our overhead as a ratio)."""
    opts = ctx.options
    body = payload(opts["payload_bytes"])
    ops = opts["ops"]
    repeats = max(1, opts.get("append_repeats") or 1)
    for conc in concurrencies(opts):
        outcomes: dict[str, list] = {v: [] for v in VARIANTS}
        for rep in range(repeats):
            turn = rep % len(VARIANTS)
            for variant in VARIANTS[turn:] + VARIANTS[:turn]:
                outcomes[variant].append(_cell(ctx, variant, conc, ops, body, rep))
        ceiling = statistics.median(o.throughput for o in outcomes["ceiling"])
        minimal = statistics.median(o.throughput for o in outcomes["minimal"])
        for variant in VARIANTS:
            runs = outcomes[variant]
            throughput = statistics.median(o.throughput for o in runs)
            units = sum(o.units for o in runs)
            extra = {"vs_minimal": round(throughput / minimal, 3) if minimal else None,
                     "vs_ceiling": round(throughput / ceiling, 3) if ceiling else None}
            if variant not in ("ceiling", "minimal"):
                extra["ceiling_over_this"] = round(ceiling / throughput, 3)
            ctx.record(variant, {"concurrency": conc, "payload_bytes": opts["payload_bytes"],
                                 "events_per_call": BATCH if variant == "batch" else 1,
                                 "connections": connection_cap(ctx, conc) or conc},
                       throughput=throughput, unit="events/s",
                       latencies_ms=[ms for o in runs for ms in o.latencies_ms], count=units,
                       verified_rows=units, repeats=repeats, runs=[round(o.throughput, 1) for o in runs],
                       p50_runs=[round(latency_summary(o.latencies_ms)["p50_ms"], 4) for o in runs], **extra)


def _cell(ctx, variant: str, conc: int, ops: int, body: dict, rep: int = 0):
    """One timed run of one variant; verified against the rows it wrote, then removed."""
    pfx = streams.prefix(ctx.run_id, "append", variant, conc, rep)
    ids = open_streams(pfx, conc)
    per_call = BATCH if variant == "batch" else 1
    calls = max(1, ops // per_call)

    pool = connection_cap(ctx, conc)
    if variant == "per-event":
        env = Envelope("BenchEvent", body)

        def op(w: int, i: int) -> int:
            Event.objects.append(ids[w], env, fence_token=1)
            return 1
        op, setup, teardown = pooled(op, pool)
    elif variant == "batch":
        envs = [Envelope("BenchEvent", body)] * BATCH

        def op(w: int, i: int) -> int:
            Event.objects.append_batch([AppendItem(ids[w], tuple(envs), 1, None)])
            return BATCH
        op, setup, teardown = pooled(op, pool)
    else:
        op, setup, teardown = _ceiling(ctx, ids, body, pool, minimal=variant == "minimal")

    with direct() if variant == "per-event" else nullcontext():
        outcome = drive(ctx, f"{variant} c={conc}", conc, calls, op, total=conc * ops, per_call=per_call,
                        setup=setup, teardown=teardown)
    verify_written(ctx, f"{variant} c={conc}", pfx, outcome.units, opened=conc)
    tidy(ctx, pfx)
    return outcome


def direct():
    """LOOM_COALESCE off for the block: `Event.objects.append` writes its own statement, whatever the
    default (per-event rows measure one statement per event; the coalescer has its own rows)."""
    from django.test.utils import override_settings

    return override_settings(LOOM_COALESCE=False)


def connection_cap(ctx, writers: int) -> int | None:
    """How many connections `writers` direct writers share on PostgreSQL; None: one each."""
    cap = ctx.options.get("pg_connections") or 32
    return cap if ctx.vendor == "postgresql" and writers > cap else None


def pooled(op, pool: int | None):
    """Wrap a worker operation so that the writers share `pool` Django connections (None: no pool).

    Each call borrows a connection object and installs it as this thread's `connections["default"]`
    (Django allows that once its thread sharing is raised), then restores the thread's own.
    """
    if pool is None:
        return op, None, None
    free: queue.SimpleQueue = queue.SimpleQueue()
    shared = []
    for _ in range(pool):
        wrapper = connections.create_connection("default")
        wrapper.inc_thread_sharing()
        shared.append(wrapper)
        free.put(wrapper)
    own: dict[int, object] = {}
    leaving = threading.Lock()

    def setup(w: int) -> None:
        own[w] = connections["default"]

    def borrowed(w: int, i: int) -> int:
        wrapper = free.get()
        connections["default"] = wrapper
        try:
            return op(w, i)
        finally:
            connections["default"] = own[w]
            free.put(wrapper)

    def teardown(w: int) -> None:
        with leaving:  # the last writer out closes the shared connections
            own.pop(w, None)
            if not own:
                for wrapper in shared:
                    wrapper.close()
                    wrapper.dec_thread_sharing()
                shared.clear()

    return borrowed, setup, teardown


def _ceiling(ctx, ids: list[str], body: dict, pool: int | None = None, minimal: bool = False):
    """The per-event statement through the raw driver: one connection per writer (or a shared pool).

    minimal: the store's MINIMAL_APPEND instead of our APPEND (each writer counts its own seq: the
    stream was opened at seq 0 and only this writer appends to it)."""
    text = json.dumps(body, separators=(",", ":"))
    conns: dict[int, object] = {}
    settings = connection.settings_dict

    if ctx.vendor == "postgresql":
        import psycopg

        from journal.store.postgres import PostgresStore, binary_arrays

        store = PostgresStore("default")
        sql = binary_arrays(store.append_sql())  # as the journal sends it where it binds on the server
        channel = conf.get("LOOM_NOTIFY_CHANNEL")
        params = [
            {"sids": [sid], "tokens": [1], "expected": [None], "rsids": [sid], "ords": [0],
             "types": ["BenchEvent"], "payloads": [text], "channel": channel}
            for sid in ids
        ]
        if minimal:
            from journal.store.postgres import MINIMAL_APPEND

            sql = MINIMAL_APPEND
            params = [{"sid": sid, "token": 1, "seq": 0, "type": "BenchEvent", "payload": text, "channel": channel}
                      for sid in ids]

        def execute(conn, w: int, i: int) -> None:
            if minimal:
                params[w]["seq"] = i + 1
            conn.execute(sql, params[w], prepare=True).fetchall()

        from journal.store.postgres import PLAN_CACHE_MODE

        def connect():
            conn = psycopg.connect(
                host=settings["HOST"] or "127.0.0.1", port=settings["PORT"] or 5432, dbname=settings["NAME"],
                user=settings["USER"] or None, password=settings["PASSWORD"] or None, autocommit=True,
            )
            conn.execute(PLAN_CACHE_MODE)  # as the journal's connections run their prepared statements
            return conn

        if pool is not None:  # more writers than connections: borrow one per statement
            free: queue.SimpleQueue = queue.SimpleQueue()
            opened = [connect() for _ in range(pool)]
            for conn in opened:
                free.put(conn)
            left = [len(ids)]
            leaving = threading.Lock()

            def op(w: int, i: int) -> int:
                conn = free.get()
                try:
                    execute(conn, w, i)
                finally:
                    free.put(conn)
                return 1

            def last_out(w: int) -> None:
                with leaving:
                    left[0] -= 1
                    if left[0] == 0:
                        for conn in opened:
                            conn.close()
            return op, None, last_out

        def setup(w: int) -> None:
            conns[w] = connect()

        def op(w: int, i: int) -> int:
            execute(conns[w], w, i)
            return 1
    else:
        from journal.store import sqlite as q

        fences = q.FENCES.format(marks="?")
        tips = q.TIPS.format(marks="?")
        insert = q.INSERT.format(rows="(?, ?, ?, ?, ?)")

        def setup(w: int) -> None:
            conn = sqlite3.connect(settings["NAME"], timeout=30, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conns[w] = conn

        def op(w: int, i: int) -> int:
            conn = conns[w]
            sid = ids[w]
            if minimal:
                if conn.execute(q.MINIMAL_APPEND, [i + 1, "BenchEvent", text, "2026-01-01 00:00:00", sid, 1]
                                ).rowcount != 1:
                    raise RuntimeError("minimal: fence refused")
                return 1
            conn.execute("BEGIN IMMEDIATE")
            try:
                token = conn.execute(fences, [sid]).fetchone()
                tip = conn.execute(tips, [sid]).fetchone()
                if token is None or token[1] != 1:
                    raise RuntimeError("ceiling: fence refused")
                conn.execute(insert, [sid, tip[1] + 1, "BenchEvent", text, "2026-01-01 00:00:00"])
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            return 1

    def teardown(w: int) -> None:
        conn = conns.pop(w, None)
        if conn is not None:
            conn.close()

    return op, setup, teardown
