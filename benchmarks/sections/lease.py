"""Section `lease`: what heartbeat leases cost a run, OFF vs EAGER vs LAZY, interleaved.

Method (docs/bench-leases.md): for every (id style, shape, concurrency) cell, N repeats; in each
repeat the three modes run back to back in a rotating order (off/eager/lazy, then
eager/lazy/off, ...), so slow drift of the machine hits every mode alike. Each sample starts
`execs` one-step durable executions on `concurrency` threads and measures executions per second.
Reported per mode: the median; per mode against OFF: overhead = (median OFF - median mode) /
median OFF, and the paired ratio of each repeat (the same repeat's OFF and mode samples, adjacent
in time) as a median and min..max. Shapes: no-op (the throughput ceiling, the worst case for a
ratio) and io (a 20 ms effect in the step). Ids: caller-chosen or minted (ULID) by start().

Every sample is verified against the database: exactly `execs` completed executions, and no lease
row left once the keeper has drained. Settings are the defaults (TTL 30 s, renewal every 10 s,
lazy grace TTL/3), so a lazy one-step run never leases: that is the cost the gate is about. On
PostgreSQL an eager one-step run leases inline (its bootstrap statement writes the lease, its settle
deletes it: leases_inline counts them), so its keeper statements are only the renewal ticks.
"""

from __future__ import annotations

import statistics
import threading
import time

from django.db import connection

from benchmarks import streams
from benchmarks.arguments import choice_list, non_negative_float, positive_int, positive_int_list
from benchmarks.cells import raise_errors
from benchmarks.harness import run_workers
from journal.flows import flow, start
from journal.flows.ownership import set_ownership
from journal.models import Execution
from journal.store import store_for as journal_store
from leases.keeper import LeaseKeeper
from leases.models import Lease
from leases.ownership import LeaseOwnership, install

MODES = ("off", "eager", "lazy")
_IO_SECONDS = {"value": 0.02}


@flow("bench.lease.noop")
def noop_flow(ctx, value):
    return ctx.step("noop", _noop)


def _noop() -> int:
    return 1


@flow("bench.lease.io")
def io_flow(ctx, value):
    return ctx.step("io", _io)


def _io() -> int:
    time.sleep(_IO_SECONDS["value"])
    return 1


# Defaults of `bench_lease`, and the short version `bench_throughput --section lease` runs.
FULL = {"lease_concurrency": "16,64,256", "lease_repeats": 5, "lease_execs": 600, "lease_io_execs": 320,
        "lease_shapes": "noop,io", "lease_ids": "caller,minted"}
SHORT = {"lease_concurrency": "16", "lease_repeats": 3, "lease_execs": 300, "lease_io_execs": 160,
         "lease_shapes": "noop", "lease_ids": "caller"}


def add_arguments(parser) -> None:
    parser.add_argument("--lease-concurrency", type=positive_int_list, default=None,
                        help="Comma-separated thread counts (bench_lease default 16,64,256; on PostgreSQL cells that "
                             "need more connections than the server has free are skipped).")
    parser.add_argument("--lease-repeats", type=positive_int, default=None,
                        help="Interleaved repeats per cell (default 5).")
    parser.add_argument("--lease-execs", type=positive_int, default=None,
                        help="No-op executions per sample (default 600).")
    parser.add_argument("--lease-io-execs", type=positive_int, default=None,
                        help="I/O-bound executions per sample (320).")
    parser.add_argument("--lease-io-ms", type=non_negative_float, default=20.0,
                        help="Effect duration of the io shape (ms).")
    parser.add_argument("--lease-shapes", type=choice_list("noop", "io"), default=None,
                        help="Comma-separated: noop, io (default both).")
    parser.add_argument("--lease-ids", type=choice_list("caller", "minted"), default=None,
                        help="Comma-separated: caller, minted (default both).")


def _list(value: str | list, parse) -> list:
    """An option as given (already parsed on the command line) or a default's text, parsed."""
    return list(value) if isinstance(value, (list, tuple)) else parse(value)


def _free_connections() -> int | None:
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('max_connections')::int - (SELECT count(*) FROM pg_stat_activity)"
                       " - current_setting('superuser_reserved_connections')::int")
        return cursor.fetchone()[0]


def _wait_for_connections(needed: int, patience: float = 90.0) -> int | None:
    """Free PostgreSQL connections, waiting up to `patience` s for `needed` (one per thread, plus the
    keeper's and ours): a shared server may be busy with other clients for a while."""
    deadline = time.monotonic() + patience
    free = _free_connections()
    while free is not None and free < needed and time.monotonic() < deadline:
        time.sleep(2)
        free = _free_connections()
    return free


def run(ctx) -> None:
    defaults = FULL if ctx.recorder.command == "bench_lease" else SHORT
    opts = {**ctx.options, **{k: v for k, v in defaults.items() if ctx.options.get(k) is None}}
    ctx.options = opts
    concs = _list(opts["lease_concurrency"], positive_int_list)
    shapes = _list(opts["lease_shapes"], choice_list("noop", "io"))
    id_styles = _list(opts["lease_ids"], choice_list("caller", "minted"))
    repeats = max(1, opts["lease_repeats"])
    _IO_SECONDS["value"] = opts["lease_io_ms"] / 1000
    try:
        for ids in id_styles:
            for shape in shapes:
                for conc in concs:
                    free = _wait_for_connections(conc + 3)
                    if free is not None and conc + 3 > free:
                        ctx.log(f"lease: skipping {ids}/{shape}/c={conc}: PostgreSQL has {free} free connections")
                        ctx.record(f"{ids}/{shape}/skipped", {"concurrency": conc, "ids": ids, "shape": shape},
                                   skipped=f"needs {conc} connections, {free} free")
                        continue
                    _cell(ctx, ids, shape, conc, repeats)
    finally:
        set_ownership(None)
        install()


def _cell(ctx, ids: str, shape: str, conc: int, repeats: int) -> None:
    execs = ctx.options["lease_execs"] if shape == "noop" else ctx.options["lease_io_execs"]
    per_thread = max(1, round(execs / conc))
    samples: dict[str, list[float]] = {m: [] for m in MODES}
    stats: dict[str, list[dict]] = {m: [] for m in MODES}
    bar = ctx.progress(repeats * len(MODES), f"{ids} {shape} c={conc}")
    for r in range(repeats):
        order = MODES[r % 3:] + MODES[:r % 3]
        for mode in order:
            rate, used = _sample(ctx, ids, shape, conc, per_thread, mode, r)
            samples[mode].append(rate)
            stats[mode].append(used)
            bar.update(1)
    bar.close()
    medians = {m: statistics.median(samples[m]) for m in MODES}
    params = {"ids": ids, "shape": shape, "concurrency": conc, "execs": per_thread * conc, "repeats": repeats,
              "vendor": ctx.vendor}
    for mode in MODES:
        paired = [(o - s) / o * 100 for o, s in zip(samples["off"], samples[mode], strict=True)]
        statements = sum(s["acquire_statements"] + s["release_statements"] + s["renew_statements"]
                         for s in stats[mode])
        overhead = (medians["off"] - medians[mode]) / medians["off"] * 100
        verdict = "" if mode == "off" else overhead_verdict(overhead, paired)
        if verdict == SPREAD_TOO_WIDE:
            ctx.command.stdout.write(
                f"lease: {ids}/{shape}/c={conc} {mode} vs off: spread too wide to say (repeats range "
                f"{min(paired):+.1f}..{max(paired):+.1f} %, wider than the median effect {overhead:+.1f} %); "
                "not a result: rerun with more --lease-repeats or on a quieter machine")
        ctx.record(f"{ids}/{shape}/{mode}", {**params, "mode": mode}, throughput=medians[mode], unit="exec/s",
                   count=per_thread * conc * repeats, samples=[round(s, 1) for s in samples[mode]],
                   order_rotated=True,
                   overhead_pct=None if verdict == SPREAD_TOO_WIDE else round(overhead, 2), verdict=verdict,
                   paired_median_pct=round(statistics.median(paired), 2),
                   paired_min_pct=round(min(paired), 2), paired_max_pct=round(max(paired), 2),
                   leases_acquired=sum(s["acquire"] for s in stats[mode]),
                   leases_inline=sum(s["inline"] for s in stats[mode]),
                   lease_statements_per_exec=round(statements / (per_thread * conc * repeats), 4))


SPREAD_TOO_WIDE = "spread too wide"


def overhead_verdict(overhead_pct: float, paired_pct: list[float]) -> str:
    """What an overhead figure may be called. The repeats' paired differences (each repeat's OFF and
    mode samples, adjacent in time) spread over a range; when that range is wider than the effect
    itself, or has repeats on both sides of zero with a median effect inside it, the figure is noise
    (SQLite on a shared machine has shown eager leases "46-66 % faster" than no lease): say so.
    A single repeat has no spread, so nothing can be said about it either."""
    if len(paired_pct) < 2:
        return SPREAD_TOO_WIDE
    width = max(paired_pct) - min(paired_pct)
    if width > abs(overhead_pct) or min(paired_pct) < 0 < max(paired_pct):
        return SPREAD_TOO_WIDE
    return "overhead" if overhead_pct > 0 else "faster"


def _sample(ctx, ids: str, shape: str, conc: int, per_thread: int, mode: str, rep: int) -> tuple[float, dict]:
    pfx = streams.prefix(ctx.run_id, "lease", ids, shape, conc, mode, rep)
    keeper = None
    if mode == "off":
        set_ownership(None)
    else:
        keeper = LeaseKeeper(f"bench-{ctx.run_id}-{mode}")
        set_ownership(LeaseOwnership(mode, keeper))
    name = "bench.lease.noop" if shape == "noop" else "bench.lease.io"
    minted: list[str] = []
    lock = threading.Lock()

    def op(w: int, i: int) -> int:
        if ids == "caller":
            outcome = start(name, {}, execution_id=f"{pfx}{w}-{i}")
        else:
            outcome = start(name, {})
            with lock:
                minted.append(outcome.execution_id)
        if outcome.status != "completed":
            raise RuntimeError(f"execution {outcome.execution_id} ended {outcome.status}: {outcome.error}")
        return 1

    outcome = run_workers(conc, per_thread, op)
    used = dict(keeper.stats) if keeper else {k: 0 for k in ("acquire", "acquire_statements", "release_statements",
                                                                "renew", "renew_statements", "release", "inline")}
    if keeper is not None:
        keeper.drain()
        keeper.shutdown()
    raise_errors(f"lease {ids}/{shape}/c={conc}/{mode}", outcome.errors)
    ours = minted if ids == "minted" else None
    done = _completed(pfx, ours)
    ctx.verify(f"{ids}/{shape}/c={conc}/{mode} completed executions", outcome.units, done)
    ctx.verify(f"{ids}/{shape}/c={conc}/{mode} lease rows left", 0, _leases(pfx, ours))
    if not ctx.options.get("keep"):
        _remove(pfx, ours)
    return outcome.throughput, used


def _chunks(values: list[str], size: int = 500):
    for i in range(0, len(values), size):
        yield values[i:i + size]


def _completed(pfx: str, ids: list[str] | None) -> int:
    if ids is None:
        return Execution.objects.filter(id__startswith=pfx, status="completed").count()
    return sum(Execution.objects.filter(id__in=part, status="completed").count() for part in _chunks(ids))


def _leases(pfx: str, ids: list[str] | None) -> int:
    if ids is None:
        return Lease.objects.filter(execution__id__startswith=pfx).count()
    return sum(Lease.objects.filter(execution_id__in=part).count() for part in _chunks(ids))


def _remove(pfx: str, ids: list[str] | None) -> None:
    if ids is None:
        streams.remove(pfx)
        Execution.objects.filter(id__startswith=pfx).delete()
        return
    journal = journal_store()
    for part in _chunks(ids):
        journal.delete_streams(ids=part)
        journal.delete_executions(ids=part)
