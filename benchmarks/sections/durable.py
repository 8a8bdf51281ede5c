"""Section `durable`: end-to-end durable executions of 1-step and 3-step no-op flows.

N threads each starting executions back to back (caller-chosen ids under the run's prefix, which
cost the same statements as minted ones). A no-op step keeps effect latency out: this is runtime +
journal cost. Events per execution (2n+2) are asserted against the rows actually written, so
events/s cannot drift from what the database holds. Whatever ownership is installed
(LOOM_LEASE_MODE) is used, and recorded with the cell.

`--flow-coalesce default,off,on` (the default) runs every cell with the settings as they are
(`default`: LOOM_COALESCE untouched, on unless the project turned it off), then without and with
LOOM_COALESCE forced, one after the other, so all three are recorded in the same run (param
`config`). Off: each thread writes on its own connection. On: every write of a fresh run goes
through the process's coalescer (on PostgreSQL the bootstrap and settle too); a caller that finds
it idle writes itself, the others queue for its flush threads; the cell records the coalescer's
statements per execution and requests per statement.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

from django.test import override_settings

from benchmarks import streams
from benchmarks.arguments import choice_list, positive_int, positive_int_list
from benchmarks.cells import raise_errors
from benchmarks.harness import counting_statements, run_workers
from journal import coalesce, conf, telemetry
from journal.flows import flow, start
from journal.flows.ownership import get_ownership
from journal.store import store_for

DEFAULT_CONCURRENCY = "1,16,64"


@flow("bench.noop1")
def noop1(ctx, value):
    return ctx.step("noop", _noop)


@flow("bench.noop3")
def noop3(ctx, value):
    ctx.step("a", _noop)
    ctx.step("b", _noop)
    return ctx.step("c", _noop)


def _noop() -> int:
    return 1


def add_arguments(parser) -> None:
    parser.add_argument("--flow-concurrency", type=positive_int_list, default=DEFAULT_CONCURRENCY,
                        help=f"Comma-separated thread counts for the durable section (default {DEFAULT_CONCURRENCY}).")
    parser.add_argument("--flow-executions", type=positive_int, default=3000,
                        help="Executions per durable cell, spread over its threads (default 3000).")
    parser.add_argument("--flow-coalesce", type=choice_list("default", "off", "on"), default="default,off,on",
                        help="LOOM_COALESCE variants of each durable cell, in order, out of default (the settings as"
                             " they are), off, on (default: default,off,on).")
    parser.add_argument("--flow-telemetry", type=choice_list("off", "on"), default="off",
                        help="Telemetry variants of each durable cell: off (the default), on (spans of the OTel SDK "
                             "to a discarding exporter, Prometheus metrics: journal/telemetry.py), e.g. off,on.")
    parser.add_argument("--flow-repeats", type=positive_int, default=1,
                        help="Rounds of the durable variants, rotating their order (each round recorded; default 1).")


def run(ctx) -> None:
    variants = ctx.options.get("flow_coalesce") or ("default", "off", "on")
    for conc in ctx.options["flow_concurrency"]:
        for steps, name in ((1, "bench.noop1"), (3, "bench.noop3")):
            for rep in range(ctx.options.get("flow_repeats") or 1):  # rotating: none always first
                turn = rep % len(variants)
                for config in variants[turn:] + variants[:turn]:  # the variants of one cell back to back
                    teles = ctx.options.get("flow_telemetry") or ("off",)
                    for tele in teles[rep % len(teles):] + teles[:rep % len(teles)]:  # rotating too
                        with telemetry_mode(tele):
                            _cell(ctx, steps, name, conc, max(1, ctx.options["flow_executions"] // conc), config,
                                  rep, tele)


@contextmanager
def telemetry_mode(mode: str):
    """Telemetry on for the cell: an SDK tracer whose spans are made, ended and handed to an exporter that
    drops them (the cost of Loom's spans, not of a collector's network), and the metrics counted."""
    if mode == "off":
        yield
        return
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    class Drop(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Drop()))
    saved = telemetry._tracer, telemetry.TRACING, telemetry.METRICS
    if not telemetry._metrics:
        telemetry._make_metrics()
    telemetry._tracer, telemetry.TRACING, telemetry.METRICS = provider.get_tracer("bench"), True, True
    try:
        yield
    finally:
        telemetry._tracer, telemetry.TRACING, telemetry.METRICS = saved
        provider.shutdown()


def _counters() -> tuple[int, int]:
    """(statements, requests) of the shared coalescer so far; (0, 0) when it is not running."""
    current = coalesce.running()
    return (current.statements, current.batched_requests) if current is not None else (0, 0)


def count_headers(pfx: str, status: str) -> int:
    return store_for().count_executions(pfx, status)


def remove_headers(pfx: str) -> None:
    """Benchmark maintenance only (see streams.remove): the runtime never deletes headers."""
    store_for().delete_executions(pfx)


def _cell(ctx, steps: int, name: str, conc: int, per_worker: int, config: str, rep: int = 0,
          tele: str = "off") -> None:
    coalesced = conf.get("LOOM_COALESCE") if config == "default" else config == "on"
    pfx = streams.prefix(ctx.run_id, "durable", steps, conc, config, rep, *(["tel"] if tele == "on" else []))
    bar = ctx.progress(conc * per_worker, f"{steps}-step c={conc} coalesce={config}")

    def op(w: int, i: int) -> int:
        out = start(name, {}, execution_id=f"{pfx}{w}:{i}")
        if out.status != "completed":
            raise RuntimeError(f"{out.execution_id}: {out.status} {out.error}")
        return 1

    coalesce.close_shared()
    overrides = {} if config == "default" else {"LOOM_COALESCE": coalesced}
    with override_settings(**overrides), counting_statements() as counter:
        try:
            start("bench.noop1", {}, execution_id=f"{pfx}warmup")  # first use (imports, flush threads) untimed
            before, counted_before, cpu_before = _counters(), counter.snapshot(), time.process_time()
            outcome = run_workers(conc, per_worker, op, progress=bar.update)
            after, counted_after, cpu = _counters(), counter.snapshot(), time.process_time() - cpu_before
        finally:
            coalesce.close_shared()
    bar.close()
    raise_errors(f"durable {steps}-step c={conc}", outcome.errors)
    executions = outcome.units + 1  # + the warm-up
    per_exec = 2 * steps + 2
    written = streams.count_events(pfx) - 4 - (per_exec * outcome.units)
    ctx.verify(f"{steps}-step c={conc} events beyond 2n+2 per execution", 0, written)
    ctx.verify(f"{steps}-step c={conc} executions completed in their header", executions,
               count_headers(pfx, "completed"))
    ctx.verify(f"{steps}-step c={conc} streams with gaps", 0, streams.check_contiguous(pfx))
    statements, requests = after[0] - before[0], after[1] - before[1]
    # Every statement of the timed executions, on every connection (worker threads, flush threads):
    all_statements = counted_after[0] - counted_before[0]
    control = counted_after[1] - counted_before[1]
    ctx.record(f"{steps}-step", {"concurrency": conc, "steps": steps, "events_per_execution": per_exec,
                                 "coalesce": coalesced, "config": config, "round": rep + 1,
                                 "lease_mode": conf.get("LOOM_LEASE_MODE"),
                                 "ownership": type(get_ownership()).__name__,
                                 "snapshot_every": conf.get("LOOM_SNAPSHOT_EVERY"),
                                 **({"telemetry": tele} if tele != "off" else {})},
               throughput=outcome.throughput, unit="exec/s", latencies_ms=outcome.latencies_ms,
               count=outcome.units, verified_rows=outcome.units * per_exec,
               statements_per_execution=round(all_statements / outcome.units, 3),
               control_statements_per_execution=round(control / outcome.units, 3),
               events_per_s=round(outcome.throughput * per_exec, 1), wall_s=round(outcome.wall_s, 4),
               # this process's CPU (every thread) per execution: steadier than exec/s on a shared machine
               cpu_ms_per_execution=round(cpu * 1000 / outcome.units, 3),
               coalesced_statements_per_execution=round(statements / outcome.units, 3) if coalesced else None,
               requests_per_statement=round(requests / statements, 2) if coalesced and statements else None)
    if not ctx.options.get("keep"):
        streams.remove(pfx)
        remove_headers(pfx)
