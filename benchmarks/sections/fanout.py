"""Section `fanout` (PostgreSQL): K real subscriber processes following the log, one writer workload.

Each subscriber is a separate Python process, as a node of a deployment would be: it LISTENs on
the journal's channel and, for every notification, reads the new events of the streams it names
(one SELECT per stream in the tips, after the last seq it saw). The writers (`--notify-writers`,
default 32, one event per append) run while K = 0, 2, 4 subscribers follow. Recorded: writer
throughput (and its ratio to K = 0) and notifications delivered per node per event. Verified:
every subscriber read every event the writers wrote, and the rows match the writers' count.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks import streams
from benchmarks.cells import drive, open_streams, tidy, verify_written
from benchmarks.children import child_env
from benchmarks.sections.append import connection_cap, payload, pooled
from benchmarks.sections.notify import connect, tips_of
from journal import conf
from journal.envelopes import Envelope
from journal.models import Event
from journal.store import store_for

NODES = (0, 2, 4)
STOP_CHANNEL = "loom_bench_stop"
ROOT = Path(__file__).resolve().parents[2]


def follow(prefix: str) -> None:
    """A subscriber node: follow the journal until told to stop, then print what it saw (JSON)."""

    store = store_for("default")
    conn = connect()
    conn.execute(f'LISTEN "{conf.get("LOOM_NOTIFY_CHANNEL")}"')
    conn.execute(f"LISTEN {STOP_CHANNEL}")
    print("ready", flush=True)
    last: dict[str, int] = {}
    notifications = events = 0
    for note in conn.notifies():
        if note.channel == STOP_CHANNEL:
            break
        tips = {sid: tip for sid, tip in tips_of(note.payload).items() if sid.startswith(prefix)}
        if not tips:
            continue
        notifications += 1
        for sid, tip in tips.items():
            if tip > last.get(sid, -1):
                read = store.read(sid, after_seq=last.get(sid, -1))
                events += len(read)
                last[sid] = read[-1].seq if read else last.get(sid, -1)
    conn.close()
    print(json.dumps({"notifications": notifications, "events": events}), flush=True)


def run(ctx) -> None:
    if ctx.vendor != "postgresql":
        ctx.skip("notifications and LISTEN exist only on PostgreSQL")
        return
    opts = ctx.options
    writers, ops = opts["notify_writers"], max(16, opts["ops"] // 2)
    body = payload(opts["payload_bytes"])
    repeats = max(1, opts["repeats"])
    samples: dict[int, list] = {n: [] for n in NODES}
    for rep in range(repeats):  # interleaved, rotating which node count goes first
        for nodes in NODES[rep % len(NODES):] + NODES[:rep % len(NODES)]:
            samples[nodes].append(_round(ctx, nodes, writers, ops, body, rep))
    base = statistics.median(c["throughput"] for c in samples[0])
    for nodes, cells in samples.items():
        tput = statistics.median(c["throughput"] for c in cells)
        mid = sorted(cells, key=lambda c: c["throughput"])[len(cells) // 2]
        ctx.record(f"{nodes} nodes", {"writers": writers, "nodes": nodes, "payload_bytes": opts["payload_bytes"],
                                      "repeats": repeats},
                   throughput=tput, unit="events/s", latencies_ms=mid["latencies"],
                   count=sum(c["units"] for c in cells), verified_rows=sum(c["units"] for c in cells),
                   vs_0_nodes=round(tput / base, 3) if base else None,
                   notifications_per_node_per_event=mid["per_node"], runs=[round(c["throughput"], 1) for c in cells])


def _round(ctx, nodes: int, writers: int, ops: int, body: dict, rep: int) -> dict:
    pfx = streams.prefix(ctx.run_id, "fanout", nodes, rep)
    ids = open_streams(pfx, writers)  # before the nodes start
    children: list[subprocess.Popen] = []
    try:  # spawned inside: when one node fails to start, the ones already started are stopped below
        for _ in range(nodes):
            children.append(_spawn(pfx))
        env = Envelope("BenchEvent", body)

        def op(w: int, i: int) -> int:
            Event.objects.append(ids[w], env, fence_token=1)
            return 1
        op, setup, teardown = pooled(op, connection_cap(ctx, writers))
        outcome = drive(ctx, f"{nodes} nodes #{rep + 1}", writers, ops, op, setup=setup, teardown=teardown)
        seen = _stop(children)
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    written = verify_written(ctx, f"{nodes} nodes round {rep + 1}", pfx, outcome.units, opened=writers)
    for n, node in enumerate(seen):  # every row of the round, the opening events included
        ctx.verify(f"{nodes} nodes round {rep + 1}: events node {n} read", written + writers, node["events"])
    tidy(ctx, pfx)
    per_node = round(sum(s["notifications"] for s in seen) / len(seen) / outcome.units, 3) if seen else None
    return {"throughput": outcome.throughput, "latencies": outcome.latencies_ms, "units": outcome.units,
            "per_node": per_node}


def _spawn(prefix: str) -> subprocess.Popen:
    # The subscribers follow the database this run writes to (benchmarks/children.py).
    env = child_env()
    code = f"import django; django.setup()\nfrom benchmarks.sections.fanout import follow\nfollow({prefix!r})\n"
    child = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    line = child.stdout.readline().strip()
    if line != "ready":
        child.kill()
        raise RuntimeError(f"fanout: a subscriber did not start: {line} {child.stderr.read()[-2000:]}")
    return child


def _stop(children: list[subprocess.Popen]) -> list[dict]:
    """Tell the nodes to stop (after every writer's notification, so they read everything first)."""
    if not children:
        return []
    with connect() as conn:
        conn.execute(f"NOTIFY {STOP_CHANNEL}")
    seen = []
    for child in children:
        out, err = child.communicate(timeout=300)
        if child.returncode != 0:
            raise RuntimeError(f"fanout: a subscriber failed ({child.returncode}): {err[-2000:]}")
        seen.append(json.loads(out.strip().splitlines()[-1]))
    return seen
