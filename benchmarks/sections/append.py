"""Section `append`: N concurrent writers, each on its own fenced stream.

Three variants in the same run, so that our overhead is a ratio and not a guess:
- per-event: `Event.objects.append` of one event per call;
- batch: `append_batch` with 16 events of the writer's stream per call;
- ceiling: the very statement of the per-event append, issued with the raw driver (psycopg or
  sqlite3), no Django, parameters prepared once. On PostgreSQL that is the fenced INSERT with its
  pg_notify; on SQLite the same BEGIN IMMEDIATE / guard reads / INSERT / COMMIT sequence.
"""

from __future__ import annotations

import json
import sqlite3

from django.db import connection

from benchmarks import streams
from benchmarks.harness import run_workers
from journal import conf
from journal.envelopes import AppendItem, Envelope
from journal.models import Event

BATCH = 16


def add_arguments(parser) -> None:
    parser.add_argument("--concurrency", default="1,8,32",
                        help="Comma-separated writer counts for the append section (default 1,8,32).")
    parser.add_argument("--ops", type=int, default=400, help="Events per writer per cell (default 400).")
    parser.add_argument("--payload-bytes", type=int, default=256, help="JSON payload size per event (default 256).")


def concurrencies(options: dict) -> list[int]:
    try:
        values = [int(v) for v in str(options["concurrency"]).split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--concurrency must be comma-separated integers, got {options['concurrency']!r}") from None
    if not values or min(values) < 1:
        raise ValueError("--concurrency needs at least one writer count >= 1")
    return values


def payload(size: int) -> dict:
    """A payload whose JSON encoding is `size` bytes (at least the envelope's own braces)."""
    base = len(json.dumps({"data": ""}, separators=(",", ":")))
    return {"data": "x" * max(0, size - base)}


def run(ctx) -> None:
    opts = ctx.options
    body = payload(opts["payload_bytes"])
    ops = opts["ops"]
    for conc in concurrencies(opts):
        for variant in ("per-event", "batch", "ceiling"):
            _cell(ctx, variant, conc, ops, body)


def _cell(ctx, variant: str, conc: int, ops: int, body: dict) -> None:
    pfx = streams.prefix(ctx.run_id, "append", variant, conc)
    ids = [f"{pfx}{w}" for w in range(conc)]
    for sid in ids:
        Event.objects.open_stream(sid, Envelope("BenchOpened"))
    bar = ctx.progress(conc * ops, f"{variant} c={conc}")
    per_call = BATCH if variant == "batch" else 1
    calls = max(1, ops // per_call)

    if variant == "per-event":
        env = Envelope("BenchEvent", body)

        def op(w: int, i: int) -> int:
            Event.objects.append(ids[w], env, fence_token=1)
            return 1
        setup = teardown = None
    elif variant == "batch":
        envs = [Envelope("BenchEvent", body)] * BATCH

        def op(w: int, i: int) -> int:
            Event.objects.append_batch([AppendItem(ids[w], tuple(envs), 1, None)])
            return BATCH
        setup = teardown = None
    else:
        op, setup, teardown = _ceiling(ctx, ids, body)

    outcome = run_workers(conc, calls, op, setup=setup, teardown=teardown,
                          progress=lambda n: bar.update(n * per_call))
    bar.close()
    if outcome.errors:
        raise RuntimeError(f"append {variant} c={conc}: {outcome.errors[:3]}")
    written = streams.count_events(pfx) - conc  # minus the opening events
    ctx.verify(f"{variant} c={conc} events", outcome.units, written)
    ctx.verify(f"{variant} c={conc} streams with gaps", 0, streams.check_contiguous(pfx))
    ctx.record(variant, {"concurrency": conc, "payload_bytes": ctx.options["payload_bytes"],
                         "events_per_call": per_call},
               throughput=outcome.throughput, unit="events/s", latencies_ms=outcome.latencies_ms,
               count=outcome.units, verified_rows=written, wall_s=round(outcome.wall_s, 4))
    if not ctx.options.get("keep"):
        streams.remove(pfx)


def _ceiling(ctx, ids: list[str], body: dict):
    """The per-event statement through the raw driver: one connection per writer."""
    text = json.dumps(body, separators=(",", ":"))
    conns: dict[int, object] = {}
    settings = connection.settings_dict

    if ctx.vendor == "postgresql":
        import psycopg

        from journal.store.postgres import PostgresStore

        store = PostgresStore("default")
        sql = store.append_sql()
        channel = conf.get("LOOM_NOTIFY_CHANNEL")
        params = [
            {"sids": [sid], "tokens": [1], "expected": [None], "rsids": [sid], "ords": [0],
             "types": ["BenchEvent"], "payloads": [text], "channel": channel}
            for sid in ids
        ]

        def setup(w: int) -> None:
            conns[w] = psycopg.connect(
                host=settings["HOST"] or "127.0.0.1", port=settings["PORT"] or 5432, dbname=settings["NAME"],
                user=settings["USER"] or None, password=settings["PASSWORD"] or None, autocommit=True,
            )

        def op(w: int, i: int) -> int:
            conns[w].execute(sql, params[w]).fetchall()
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
