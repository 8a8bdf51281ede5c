"""Section `executions`: 1-step durable flows with a 100 ms effect, concurrency 32 ... 2048.

Each of C threads runs `--exec-rounds` executions (default 3) one after another through
`journal.flows.start`; the step sleeps `--effect-ms` (100). Little's law bounds what C
concurrent executions can do: C / effect time per second; efficiency is the measured exec/s
against that bound, so it says how much of the concurrency the write path lets through.

Connections: PostgreSQL allows 100 here, far fewer than 2048 threads. The section runs with
LOOM_COALESCE on: every write of a fresh run (bootstrap, mid-run appends, settle) goes through the
process's coalescer, whose flush threads own the connections, so an execution thread holds no
connection at all. Write time is measured without touching the write path: each thread adds up
its runs' wall time and the time inside the effect; the rest (writes waiting in the coalescer,
plus the runtime's own small overhead) is the write time. The coalescer's counters (statements,
requests per statement, its flush threads' time inside statements) are recorded with the cell.
Default sweep 32,128,512; `--full` adds 1024 and 2048.
"""

from __future__ import annotations

import contextlib
import threading
import time

from django.test import override_settings

from benchmarks import streams
from benchmarks.arguments import non_negative_float, positive_int, positive_int_list
from benchmarks.cells import raise_errors
from benchmarks.harness import counting_statements, run_workers
from journal import coalesce
from journal.flows import flow, start
from journal.store import store_for

DEFAULT = "32,128,512"
FULL = "32,128,512,1024,2048"
FLOW = "bench.effect"


@flow(FLOW)
def bench_effect(ctx, input):
    """One step whose effect waits `ms` milliseconds (an I/O call: an API, a model, a queue)."""
    return ctx.step("effect", _effect, input["ms"])


def _effect(ms: float) -> int:
    began = time.perf_counter()
    if ms:
        time.sleep(ms / 1000)
    _tally("effect", time.perf_counter() - began)
    return 1


_tallies = threading.local()


def _tally(kind: str, seconds: float) -> None:
    totals = getattr(_tallies, "totals", None)
    if totals is not None:
        totals[kind] = totals.get(kind, 0.0) + seconds


def add_arguments(parser) -> None:
    parser.add_argument("--exec-concurrency", type=positive_int_list, default=None,
                        help=f"Concurrent executions of the executions section (default {DEFAULT}; --full: {FULL}).")
    parser.add_argument("--exec-rounds", type=positive_int, default=3, help="Executions per thread per cell (3).")
    parser.add_argument("--effect-ms", type=non_negative_float, default=100.0,
                        help="Effect latency of executions (100 ms).")


def run_cell(ctx, label: str, conc: int, rounds: int, effect_ms: float, rep: int = 0) -> dict:
    """C threads x rounds executions; verified against the rows; returns figures and tallies."""
    pfx = streams.prefix(ctx.run_id, label, conc, effect_ms, rep)
    totals: list[dict] = []
    lock = threading.Lock()
    failures: list[str] = []

    def setup(w: int) -> None:
        _tallies.totals = {}

    def op(w: int, i: int) -> int:
        began = time.perf_counter()
        try:
            outcome = start(FLOW, {"ms": effect_ms}, execution_id=f"{pfx}{w}:{i}")
        finally:
            _tally("run", time.perf_counter() - began)
        if outcome.status != "completed":
            with lock:
                failures.append(f"{outcome.execution_id}: {outcome.status} {outcome.error}")
            return 0
        return 1

    def teardown(w: int) -> None:
        with lock:
            totals.append(_tallies.totals)
        _tallies.totals = None

    bar = ctx.progress(conc * rounds, f"{label} c={conc} effect={effect_ms:g}ms")
    coalesce.close_shared()
    try:
        with override_settings(LOOM_COALESCE=True), counting_statements() as counter:
            outcome = run_workers(conc, rounds, op, setup=setup, teardown=teardown,
                                  progress=lambda n: bar.update(n))
            coalescer = coalesce.running()
            coalesced, requests, busy_s = ((coalescer.statements, coalescer.batched_requests, coalescer.busy_s)
                                           if coalescer is not None else (0, 0, 0.0))
            statements, control = counter.snapshot()
    finally:
        coalesce.close_shared()
    bar.close()
    raise_errors(f"{label} c={conc}", outcome.errors + failures)
    executions = conc * rounds
    events = streams.count_events(pfx)
    per_exec = events / executions
    # every execution: one stream, the same number of events
    streams_written, least, most = store_for().events_per_stream(pfx)
    ctx.verify(f"{label} c={conc} completed executions", executions, outcome.units)
    ctx.verify(f"{label} c={conc} execution streams", executions, streams_written)
    ctx.verify(f"{label} c={conc} events per execution (least vs most)", most, least)
    ctx.verify(f"{label} c={conc} streams with gaps", 0, streams.check_contiguous(pfx))
    if not ctx.options.get("keep"):
        streams.remove(pfx)
        _remove_headers(pfx)
    effect_s = sum(t.get("effect", 0.0) for t in totals)
    return {
        "executions": executions, "events": events, "events_per_execution": per_exec,
        "exec_per_s": executions / outcome.wall_s, "latencies": outcome.latencies_ms, "wall_s": outcome.wall_s,
        "write_s": max(0.0, sum(t.get("run", 0.0) for t in totals) - effect_s), "effect_s": effect_s,
        "statements": statements, "control_statements": control, "coalesced_statements": coalesced,
        "requests_per_statement": round(requests / coalesced, 2) if coalesced else None,
        "flush_busy_s": round(busy_s, 3),
    }


def _remove_headers(pfx: str) -> None:
    """The flows' execution header rows of this benchmark (table of the flows app, if present)."""
    from django.db import DatabaseError, transaction

    with contextlib.suppress(DatabaseError), transaction.atomic():
        store_for().delete_executions(pfx)


def run(ctx) -> None:
    opts = ctx.options
    concs = opts.get("exec_concurrency") or positive_int_list(FULL if opts.get("full") else DEFAULT)
    effect_ms = opts["effect_ms"]
    for conc in concs:
        cell = run_cell(ctx, "executions", conc, opts["exec_rounds"], effect_ms)
        little = conc / (effect_ms / 1000) if effect_ms else None
        ctx.record("1-step", {"concurrency": conc, "effect_ms": effect_ms, "rounds": opts["exec_rounds"],
                              "coalesce": True},
                   throughput=cell["exec_per_s"], unit="exec/s", latencies_ms=cell["latencies"],
                   count=cell["executions"], verified_rows=cell["events"],
                   events_per_s=round(cell["exec_per_s"] * cell["events_per_execution"], 1),
                   littles_law=little, efficiency=round(cell["exec_per_s"] / little, 3) if little else None,
                   wall_s=round(cell["wall_s"], 3),
                   statements_per_execution=round(cell["statements"] / cell["executions"], 3),
                   control_statements_per_execution=round(cell["control_statements"] / cell["executions"], 3),
                   coalesced_statements_per_execution=round(cell["coalesced_statements"] / cell["executions"], 3),
                   requests_per_statement=cell["requests_per_statement"])
