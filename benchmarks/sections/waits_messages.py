"""Section `messages`: the round trip of a message into a waiting flow and an event out of it.

Method (docs/flows.md, "Benchmarks"): C flows (`--msg-concurrency`, default 1 and 64) are started
in the bench process and park on `ctx.recv("ping")`; one `loom_worker --no-cluster` child runs the
waker. C caller threads (one per flow) then do `--msg-rounds` rounds each: `send(id, "ping", i,
message_id=i)` -> the worker wakes the flow, which receives it and `ctx.set_event("pong-<i>", i)`
and parks on the next recv -> the caller's `get_event(id, "pong-<i>", timeout=...)` returns i. One
round trip = send to get_event returning. Reported per C: p50/p99/max and round trips per second.
On PostgreSQL a cell needs a connection per waiting caller (its own; get_event's LISTEN session is one
per process, journal/flows/event_listener.py): a cell the server has no room for is recorded as skipped,
with the reason. The cells run
in a rotating order over `--msg-repeats` repeats (so drift hits every C alike); the
median repeat's latencies are recorded with every repeat's throughput. Verified: every message
consumed once (a flow's result is its round count and get_event saw every value).
"""

from __future__ import annotations

import statistics

from benchmarks import streams
from benchmarks.arguments import positive_int, positive_int_list
from benchmarks.harness import run_workers
from benchmarks.sections import waits
from benchmarks.sections.lease import _wait_for_connections
from journal.flows import get_event, send, start
from journal.models import Execution

_MISSING = object()


def add_arguments(parser) -> None:
    parser.add_argument("--msg-concurrency", type=positive_int_list, default=[1, 64],
                        help="Comma-separated numbers of concurrent flows (default 1,64).")
    parser.add_argument("--msg-rounds", type=positive_int, default=20, help="Round trips per flow (20).")
    parser.add_argument("--msg-repeats", type=positive_int, default=3, help="Interleaved repeats per cell (3).")
    parser.add_argument("--msg-timeout", type=positive_int, default=60,
                        help="Seconds a caller waits for one event before the cell fails (60).")


def run(ctx) -> None:
    opts = ctx.options
    cells, rounds, repeats = list(opts["msg_concurrency"]), opts["msg_rounds"], opts["msg_repeats"]
    pfx = streams.prefix(ctx.run_id, "waits-msg")
    skipped = {}
    for c in list(cells):
        # On PostgreSQL each waiting caller holds its Django connection; the process's get_event callers
        # share one LISTEN session (and the worker child holds a few).
        needed = c + 10
        free = _wait_for_connections(needed, patience=30)
        if free is not None and free < needed:
            skipped[c] = f"needs {needed} PostgreSQL connections (1 per waiting caller), {free} free"
            cells.remove(c)
    samples: dict[int, list[dict]] = {c: [] for c in cells}
    try:
        with waits.worker(f"bench-messages-{ctx.run_id}") as proc:
            for rep in range(repeats):
                order = cells[rep % len(cells):] + cells[:rep % len(cells)]
                for c in order:
                    samples[c].append(_round(ctx, proc, f"{pfx}c{c}r{rep}:", c, rounds, opts["msg_timeout"]))
    finally:
        if not opts.get("keep"):
            waits.remove(pfx)
    for c, reason in skipped.items():
        ctx.log(f"messages: C={c} skipped: {reason}")
        ctx.record("round trip", {"concurrency": c, "rounds": rounds, "repeats": repeats}, skipped=reason)
    for c, runs in samples.items():
        mid = sorted(runs, key=lambda r: r["throughput"])[len(runs) // 2]
        ctx.record("round trip", {"concurrency": c, "rounds": rounds, "repeats": repeats},
                   throughput=statistics.median(r["throughput"] for r in runs), unit="round trips/s",
                   latencies_ms=mid["latencies"], count=sum(r["units"] for r in runs),
                   runs=[round(r["throughput"], 1) for r in runs], **waits.worker_settings())


def _round(ctx, proc: waits.WorkerProcess, pfx: str, concurrency: int, rounds: int, timeout: int) -> dict:
    ids = [f"{pfx}{w}" for w in range(concurrency)]
    for eid in ids:
        out = start("bench.waits.echo", {"rounds": rounds}, execution_id=eid)
        if out.status != "waiting":
            raise RuntimeError(f"messages: the echo flow did not park on its recv: {out}")

    def op(w: int, i: int) -> int:
        send(ids[w], "ping", i, message_id=str(i))
        got = get_event(ids[w], f"pong-{i}", timeout=timeout, default=_MISSING)
        if got is _MISSING:
            proc.alive()
            raise RuntimeError(f"no pong-{i} from {ids[w]} within {timeout} s")
        if got != i:
            raise RuntimeError(f"{ids[w]} answered pong-{i} = {got!r}")
        return 1

    bar = ctx.progress(concurrency * rounds, f"C={concurrency}")
    outcome = run_workers(concurrency, rounds, op, progress=bar.update)
    bar.close()
    if outcome.errors:
        raise RuntimeError(f"messages C={concurrency}: {outcome.errors[:3]}\n{proc.tail()}")
    ctx.verify(f"round trips C={concurrency}", concurrency * rounds, outcome.units)
    _settled(ctx, proc, pfx, concurrency, rounds)
    return {"throughput": outcome.throughput, "latencies": outcome.latencies_ms, "units": outcome.units}


def _settled(ctx, proc: waits.WorkerProcess, pfx: str, concurrency: int, rounds: int) -> None:
    """Every flow completed with its round count: each message was received once."""
    import time

    deadline = time.monotonic() + 60
    while Execution.objects.filter(pk__startswith=pfx, status="completed").count() < concurrency:
        proc.alive()
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    results = list(Execution.objects.filter(pk__startswith=pfx, status="completed").values_list("result", flat=True))
    ctx.verify(f"echo flows completed C={concurrency}", concurrency, len(results))
    ctx.verify(f"rounds received C={concurrency}", concurrency * rounds, sum(results))
