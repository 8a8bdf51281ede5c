"""Section `latency` of bench_reactions: commit -> handler through the background drain service."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

from django.test.utils import override_settings

from benchmarks import streams
from benchmarks.arguments import positive_float, rate_list
from benchmarks.children import ROOT, child_env
from benchmarks.sections.reactions.support import cleanup, wait, wakeup
from journal.envelopes import Envelope
from journal.models import Event
from projections.correlate import start_at_tip
from projections.declarations import reaction
from projections.service import DrainService


def add_arguments(parser) -> None:
    parser.add_argument("--rates", type=rate_list, default="idle,100,1000",
                        help="Latency scenarios: idle and/or commits per second (default idle,100,1000).")
    parser.add_argument("--seconds", type=positive_float, default=3.0, help="Duration of each sustained-rate run.")


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


def run(ctx) -> None:
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
                            wait(lambda key=(sid, a.last_seq): key in handled, 10)
                            time.sleep(0.02)
                        params = {"rate": "idle", "commits": len(done)}
                    else:
                        r = int(rate)
                        code = PRODUCER.format(rate=r, seconds=ctx.options["seconds"], prefix=f"{pfx}{r}:",
                                               threads=min(8, max(1, r // 100)))
                        out = subprocess.run([sys.executable, "-c", code], env=child_env(), cwd=ROOT,
                                             capture_output=True, text=True, timeout=300)
                        if out.returncode:
                            raise RuntimeError(f"producer failed: {out.stderr[-2000:]}")
                        done = [tuple(row) for row in json.loads(out.stdout.strip().splitlines()[-1])]
                        expected = len(done)
                        wait(lambda n=expected: len(handled) >= n, 120)
                        params = {"rate": r, "seconds": ctx.options["seconds"], "commits": len(done)}
                    with lock:
                        seen = dict(handled)
                    ctx.verify(f"latency {rate}: handled", len(done), sum(1 for d in done if (d[0], d[1]) in seen))
                    committed = [(seen[(sid, seq)] - t_end) * 1000 for sid, seq, _, t_end in done]
                    e2e = sorted((seen[(sid, seq)] - t0) * 1000 for sid, seq, t0, _ in done)
                    appends = sorted((t_end - t0) * 1000 for _, _, t0, t_end in done)
                    span = max(d[3] for d in done) - min(d[2] for d in done)
                    # throughput is the commit rate achieved (commits/s); the latencies are in ms (p50_ms...).
                    ctx.record(f"latency {rate}", {**params, "wakeup": wakeup(ctx)}, unit="commits/s",
                               throughput=len(done) / span if span > 0 else None,
                               latencies_ms=committed, count=len(done),
                               append_to_handler_p50_ms=round(e2e[len(e2e) // 2], 2),
                               append_to_handler_p99_ms=round(e2e[min(len(e2e) - 1, int(len(e2e) * 0.99))], 2),
                               append_p50_ms=round(appends[len(appends) // 2], 2))
            finally:
                service.stop(10)
    finally:
        cleanup(ctx, [name], pfx)
