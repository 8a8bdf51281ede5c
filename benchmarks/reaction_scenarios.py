"""Sections of `manage.py bench_reactions`: reaction latency, claim contention, watermark-aware
claims, batch vs per-event projection replay, lane responsiveness (see docs/bench-reactions.md).

Each section declares its own consumers in the process registry, starts them at the log's tip
(no history scan), verifies what the handlers saw against the journal, then removes its
consumers, subscriptions, checkpoints and (unless --keep) its streams.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from django.db import connection
from django.test.utils import override_settings

from benchmarks import streams
from benchmarks.arguments import positive_float, positive_int, positive_int_list, rate_list
from benchmarks.harness import run_workers
from journal.envelopes import Envelope
from journal.models import Event
from projections.correlate import correlate, start_at_tip
from projections.declarations import lane, projection, reaction, registry
from projections.drain import DrainController
from projections.models import Checkpoint, Subscription
from projections.service import DrainService, drain

ROOT = Path(__file__).resolve().parent.parent


def add_arguments(parser) -> None:
    parser.add_argument("--rates", type=rate_list, default="idle,100,1000",
                        help="Latency scenarios: idle and/or commits per second (default idle,100,1000).")
    parser.add_argument("--seconds", type=positive_float, default=3.0, help="Duration of each sustained-rate run.")
    parser.add_argument("--workers", type=positive_int_list, default="1,3,5", help="Claim contention worker counts.")
    parser.add_argument("--streams", type=positive_int_list, default="100,500", help="Claim contention stream counts.")
    parser.add_argument("--subscriptions", type=positive_int, default=10_000, help="Watermark section: subscriptions.")
    parser.add_argument("--replay", type=positive_int_list, default="1000,5000", help="Replay section: event counts.")


def _cleanup(ctx, names: list[str], prefix: str | None) -> None:
    for name in names:
        registry.remove(name)
    Subscription.objects.filter(consumer__in=names).delete()
    Checkpoint.objects.filter(consumer__in=names).delete()
    if prefix and not ctx.options.get("keep"):
        streams.remove(prefix)
    registry.lanes = {k: v for k, v in registry.lanes.items() if k == "default" or registry.in_lane(k)}


def _child_env() -> dict[str, str]:
    s = connection.settings_dict
    # The children inherit DJANGO_SETTINGS_MODULE: the same settings as this process, whatever project
    # hosts the apps (settings.SETTINGS_MODULE is None under override_settings, so it is not used).
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if connection.vendor == "sqlite":
        env["DATABASE_URL"] = f"sqlite:///{s['NAME']}"
    else:
        user = s.get("USER") or "postgres"
        pw = f":{s['PASSWORD']}" if s.get("PASSWORD") else ""
        host = f"{s.get('HOST') or '127.0.0.1'}:{s.get('PORT') or 5432}"
        env["DATABASE_URL"] = f"postgres://{user}{pw}@{host}/{s['NAME']}"
    return env


PRODUCER = """
import django, json, sys, threading, time
django.setup()
from journal.envelopes import Envelope
from journal.models import Event
from django.db import connection, connections
rate, seconds, prefix, threads = {rate}, {seconds}, {prefix!r}, {threads}
total = int(rate * seconds)
start = time.time() + 0.5
done, errors = [], []
def run(k):
    try:
        if connection.vendor == "postgresql":
            # The load generator only: its commits do not wait for fsync, so a slow shared disk
            # does not cap the commit rate. The drain side keeps the default durability.
            connection.cursor().execute("SET synchronous_commit = off")
        for i in range(k, total, threads):
            delay = start + i / rate - time.time()
            if delay > 0:
                time.sleep(delay)
            sid = f"{{prefix}}{{i % 256}}"
            t = time.time()
            a = Event.objects.append(sid, Envelope("BenchReact", {{"t": t}}))
            done.append((sid, a.last_seq, t, time.time()))
    except Exception as exc:
        errors.append(repr(exc))
    finally:
        connections.close_all()
ts = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
[t.start() for t in ts]; [t.join() for t in ts]
if errors:
    sys.exit("producer: " + "; ".join(errors[:3]))
print(json.dumps(done))
"""


# -- latency ------------------------------------------------------------------------------------

def latency(ctx) -> None:
    """Commit -> handler, through the background drain service (NOTIFY on PostgreSQL, polling on SQLite).

    Two clocks per event: `commit -> handler` from the moment the append returned (committed) to the
    handler's call; `append -> handler` from before the append (includes the commit itself, which on
    a slow-fsync disk dominates). Producers at a rate run in a separate process (up to 8 threads,
    synchronous_commit off on PostgreSQL for the generator only); `throughput` is the commit rate
    actually achieved.
    """
    pfx = streams.prefix(ctx.run_id, "react")
    name = f"bench-react-{ctx.run_id}"
    handled: dict[tuple[str, int], float] = {}
    lock = threading.Lock()

    @reaction(name, on=["BenchReact"], atomic=False)
    def record(event, target):
        now = time.time()
        with lock:
            handled[(event.stream_id, event.seq)] = now

    start_at_tip([name])
    overrides = {"LOOM_DRAIN_STREAMS": 64, "LOOM_DRAIN_BATCH": 200}
    if ctx.vendor == "sqlite":
        overrides.update(LOOM_DRAIN_POLL_MS=5)  # no NOTIFY: polling is the only wake-up
    try:
        with override_settings(**overrides):
            service = DrainService()
            service.start()
            try:
                for rate in ctx.options["rates"]:
                    handled.clear()
                    if rate == "idle":
                        done = []
                        for i in range(50):
                            sid = f"{pfx}idle{i % 8}"
                            t = time.time()
                            a = Event.objects.append(sid, Envelope("BenchReact", {"t": t}))
                            done.append((sid, a.last_seq, t, time.time()))
                            _wait(lambda key=(sid, a.last_seq): key in handled, 10)
                            time.sleep(0.02)
                        params = {"rate": "idle", "commits": len(done)}
                    else:
                        r = int(rate)
                        code = PRODUCER.format(rate=r, seconds=ctx.options["seconds"], prefix=f"{pfx}{r}:",
                                               threads=min(8, max(1, r // 100)))
                        out = subprocess.run([sys.executable, "-c", code], env=_child_env(), cwd=ROOT,
                                             capture_output=True, text=True, timeout=300)
                        if out.returncode:
                            raise RuntimeError(f"producer failed: {out.stderr[-2000:]}")
                        done = [tuple(row) for row in json.loads(out.stdout.strip().splitlines()[-1])]
                        expected = len(done)
                        _wait(lambda n=expected: len(handled) >= n, 120)
                        params = {"rate": r, "seconds": ctx.options["seconds"], "commits": len(done)}
                    with lock:
                        seen = dict(handled)
                    ctx.verify(f"latency {rate}: handled", len(done), sum(1 for d in done if (d[0], d[1]) in seen))
                    committed = [(seen[(sid, seq)] - t_end) * 1000 for sid, seq, _, t_end in done]
                    e2e = sorted((seen[(sid, seq)] - t0) * 1000 for sid, seq, t0, _ in done)
                    appends = sorted((t_end - t0) * 1000 for _, _, t0, t_end in done)
                    span = max(d[3] for d in done) - min(d[2] for d in done)
                    # throughput is the commit rate achieved (commits/s); the latencies are in ms (p50_ms...).
                    ctx.record(f"latency {rate}", {**params, "wakeup": _wakeup(ctx)}, unit="commits/s",
                               throughput=len(done) / span if span > 0 else None,
                               latencies_ms=committed, count=len(done),
                               append_to_handler_p50_ms=round(e2e[len(e2e) // 2], 2),
                               append_to_handler_p99_ms=round(e2e[min(len(e2e) - 1, int(len(e2e) * 0.99))], 2),
                               append_p50_ms=round(appends[len(appends) // 2], 2))
            finally:
                service.stop(10)
    finally:
        _cleanup(ctx, [name], pfx)


def _wakeup(ctx) -> str:
    return "notify" if ctx.vendor == "postgresql" else "poll 5 ms"


def _wait(condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError("bench_reactions: timed out waiting for the handlers")
        time.sleep(0.0005)


# -- claim contention -----------------------------------------------------------------------------

def contention(ctx) -> None:
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
                if outcome.errors:
                    raise RuntimeError(f"contention: {outcome.errors[:3]}")
                acked = Subscription.objects.filter(consumer=name, at=4).count()
                ctx.verify(f"contention {w}x{s}: streams acked", s, acked)
                ctx.record("claim", {"workers": w, "streams": s, "events_per_stream": 5},
                           throughput=s / outcome.wall_s, unit="streams/s", count=s,
                           cycles=counts["cycles"], empty_cycles=counts["empty"],
                           waste_pct=round(100 * counts["empty"] / max(1, counts["cycles"]), 1),
                           wall_s=round(outcome.wall_s, 4))
            finally:
                _cleanup(ctx, [name], pfx)


# -- watermark-aware claims -----------------------------------------------------------------------

def watermark(ctx) -> None:
    """N caught-up subscriptions plus 10 with work: ms per drain cycle and rows claimed."""
    n = ctx.options["subscriptions"]
    pfx = streams.prefix(ctx.run_id, "wm")
    name = f"bench-wm-{ctx.run_id}"
    handled = []
    reaction(name, on=["BenchWm"], atomic=False)(lambda e, t: handled.append(e.seq))
    start_at_tip([name])
    try:
        from projections.store import store_for

        # caught up, no events yet
        store_for().insert_caught_up([(name, f"{pfx}{i}", "default", 0, -1, -1) for i in range(n)])
        active = [f"{pfx}{i}" for i in range(0, n, max(1, n // 10))][:10]
        for sid in active:
            Event.objects.append(sid, Envelope("BenchWm"))
        controller = DrainController(registry, registry.lanes["default"], "bench-wm")
        times, claimed = [], []
        for r in range(20):
            if r:
                Event.objects.append_batch([(sid, Envelope("BenchWm")) for sid in active])
            correlate(registry)
            t = time.perf_counter()
            result = controller.cycle()
            times.append((time.perf_counter() - t) * 1000)
            claimed.append(result.claimed)
        ctx.verify("watermark: handled", 10 * 20, len(handled))
        ctx.record("watermark-aware claim", {"subscriptions": n, "active": 10, "cycles": 20},
                   unit="ms/cycle", latencies_ms=times, count=20, claimed_per_cycle=max(claimed))
    finally:
        _cleanup(ctx, [name], pfx)


# -- projection replay ----------------------------------------------------------------------------

def replay(ctx) -> None:
    """Rebuild a read model of N events (10 streams) with real upserts: per-event vs batch."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS bench_proj_totals (stream varchar(200) PRIMARY KEY,"
                       " n bigint NOT NULL, total bigint NOT NULL)")
    upsert = ("INSERT INTO bench_proj_totals (stream, n, total) VALUES (%s, 1, %s) ON CONFLICT (stream)"
              " DO UPDATE SET n = bench_proj_totals.n + 1, total = bench_proj_totals.total + excluded.total")
    for events in ctx.options["replay"]:
        pfx = streams.prefix(ctx.run_id, "replay", events)
        per_stream = events // 10
        sids = [f"{pfx}{i}" for i in range(10)]
        for start in range(0, per_stream, 500):
            k = min(500, per_stream - start)
            Event.objects.append_batch([(sid, [Envelope("BenchAdded", {"v": 1})] * k) for sid in sids])
        for variant in ("per-event, one transaction each", "per-event", "batch"):
            name = f"bench-replay-{ctx.run_id}-{events}-{variant.split(',')[0]}-{len(variant)}"
            with connection.cursor() as cursor:
                cursor.execute("DELETE FROM bench_proj_totals WHERE stream LIKE %s", [pfx + "%"])

            def one(event, target):
                with connection.cursor() as cursor:
                    cursor.execute(upsert, [event.stream_id, event.payload["v"]])

            def many(evs, target):
                # One statement for the claim: the events folded per stream first, then one upsert.
                folded: dict[str, list[int]] = {}
                for e in evs:
                    f = folded.setdefault(e.stream_id, [0, 0])
                    f[0] += 1
                    f[1] += e.payload["v"]
                with connection.cursor() as cursor:
                    cursor.executemany(
                        "INSERT INTO bench_proj_totals (stream, n, total) VALUES (%s, %s, %s) ON CONFLICT (stream)"
                        " DO UPDATE SET n = bench_proj_totals.n + excluded.n,"
                        " total = bench_proj_totals.total + excluded.total",
                        [(s, n, t) for s, (n, t) in folded.items()])

            if variant == "batch":
                projection(name, on=["BenchAdded"], batch=many, source=pfx)
            else:
                projection(name, on=["BenchAdded"], handler=one, source=pfx)
            Checkpoint.objects.filter(consumer=name).delete()
            try:
                # Subscribe first (correlation is not what is measured), then time the drain only.
                _subscribe(name, sids)
                batch = 1 if variant.startswith("per-event,") else 500
                with override_settings(LOOM_DRAIN_BATCH=batch, LOOM_DRAIN_STREAMS=10):
                    t = time.perf_counter()
                    result = drain(scan=False)
                    wall = time.perf_counter() - t
                with connection.cursor() as cursor:
                    cursor.execute("SELECT COALESCE(SUM(n), 0) FROM bench_proj_totals WHERE stream LIKE %s",
                                   [pfx + "%"])
                    rows = cursor.fetchone()[0]
                ctx.verify(f"replay {events} {variant}: projected", events, int(rows))
                ctx.verify(f"replay {events} {variant}: handled", events, result.handled)
                ctx.record(f"replay {variant}", {"events": events, "streams": 10, "batch": batch},
                           throughput=events / wall, unit="events/s", count=events, wall_ms=round(wall * 1000, 1))
            finally:
                _cleanup(ctx, [name], None)
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM bench_proj_totals WHERE stream LIKE %s", [pfx + "%"])
        if not ctx.options.get("keep"):
            streams.remove(pfx)


def _subscribe(name: str, sids: list[str]) -> None:
    from projections.store import store_for

    c = registry.consumers[name]
    store_for().bump([(name, sid, c.source, c.lane, c.priority, Event.objects.tip(sid)) for sid in sids])


# -- lanes ----------------------------------------------------------------------------------------

def lanes(ctx) -> None:
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
                        _wait(lambda r=rnd, out=samples, done=slow_done: len(out) >= 50 * (r + 1)
                              and len(done) >= 5 * (r + 1), 60)
                finally:
                    service.stop(10)
            ctx.verify(f"lanes {layout}: fast handled", 150, len(samples))
            ctx.record(f"fast lane, {layout}", {"slow_handler_ms": 100, "slow_events": 5, "fast_events": 50,
                                                "rounds": 3, "wakeup": _wakeup(ctx)},
                       unit="ms", latencies_ms=samples, count=len(samples))
        finally:
            _cleanup(ctx, [slow_name, fast_name], pfx)


SECTIONS = {
    "latency": latency,
    "contention": contention,
    "watermark": watermark,
    "replay": replay,
    "lanes": lanes,
}
