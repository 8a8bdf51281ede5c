"""Section `aggregates` of `manage.py bench_aggregates`: the scenarios of the Act reference, on our journal.

Sequential scenarios (one thread, warm process cache unless said otherwise) report p50 per operation
and ops/s = operations / wall time. Batch scenarios run N threads, each with its own connection, in
rounds: a round starts all threads together and ends when the last one has committed; they report
p50 per batch, batches/s and effective commits/s = commits / total batch time, like the reference.

Every cell checks what it wrote against the journal rows (count, contiguous seqs, final state).
Streams are `bench:<run>:agg:...` (the bench states use the stream prefix `bench:`), removed after
the run unless --keep.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

from benchmarks import streams
from benchmarks.arguments import positive_int
from benchmarks.cells import raise_errors
from benchmarks.domains import calculator as calculator_domain
from benchmarks.domains import counter as counter_domain
from benchmarks.domains import inventory as inventory_domain
from benchmarks.domains import ticket as ticket_domain
from benchmarks.domains.calculator import KEYS
from journal.aggregates import InvariantViolated, cache, do, do_with_retry, load
from journal.envelopes import Envelope
from journal.models import Event

SCENARIOS = ("raw-append", "single-commit", "single-commit-versioned", "warm-load", "cold-replay-100", "commit-load",
             "fanout-50", "contended-20", "ticket-workflow", "shared-inventory", "calculator-session")


# -- the bench's states of the example domains (benchmarks/domains); prefix "bench:" so a run removes them --
_counter = counter_domain.declare("BenchCounter", prefix="bench:")
counter, increment = _counter.state, _counter.increment
_versioned = counter_domain.declare_versioned("BenchVersionedCounter", prefix="bench:")
versioned, increment_v2 = _versioned.state, _versioned.increment
_ticket = ticket_domain.declare("BenchTicket", prefix="bench:")
ticket, open_ticket, assign, close = _ticket.state, _ticket.open_ticket, _ticket.assign, _ticket.close
_inventory = inventory_domain.declare("BenchInventory", prefix="bench:")
inventory, restock, reserve = _inventory.state, _inventory.restock, _inventory.reserve
_calculator = calculator_domain.declare("BenchCalculator", prefix="bench:")
calculator, press_digit, press_operator = _calculator.state, _calculator.press_digit, _calculator.press_operator


# -- driving -------------------------------------------------------------------------------------------
def add_arguments(parser) -> None:
    parser.add_argument("--scenario", action="append", choices=SCENARIOS,
                        help="Run only this aggregate scenario (repeatable). Default: all.")
    parser.add_argument("--iterations", type=positive_int, default=300,
                        help="Operations per sequential scenario (default 300).")
    parser.add_argument("--rounds", type=positive_int, default=30, help="Rounds per batch scenario (default 30).")
    parser.add_argument("--fanout", type=positive_int, default=50, help="Threads of fanout-50 (default 50).")
    parser.add_argument("--contenders", type=positive_int, default=20, help="Threads of contended-20 (default 20).")
    parser.add_argument("--reservations", type=positive_int, default=10,
                        help="Contending threads of shared-inventory (default 10).")
    parser.add_argument("--stock", type=positive_int, default=8,
                        help="Units per shared-inventory round; reservations beyond it are refused (default 8).")


@dataclass
class Batches:
    latencies_ms: list[float] = field(default_factory=list)
    units: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def wall_s(self) -> float:
        return sum(self.latencies_ms) / 1000


class Tally:
    """A count the worker threads add to (conflicts retried, reservations refused); `add` fits on_conflict."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def add(self, *_) -> None:
        with self._lock:
            self.count += 1


def run_rounds(threads: int, rounds: int, op: Callable[[int, int], int], bar) -> Batches:
    """Each round: all threads run `op(worker, round)` together; the batch time ends with the last one."""
    out = Batches()
    lock = threading.Lock()
    start = threading.Barrier(threads + 1)
    end = threading.Barrier(threads + 1)

    def worker(w: int) -> None:
        try:
            connection.ensure_connection()  # connection set-up stays out of the timed rounds
            for r in range(rounds):
                start.wait()
                try:
                    units = op(w, r)
                except Exception as exc:  # reported after the rounds; the cell then fails loudly
                    units = 0
                    with lock:
                        out.errors.append(f"worker {w} round {r}: {type(exc).__name__}: {exc}")
                with lock:
                    out.units += units
                end.wait()
        finally:
            connections.close_all()

    pool = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(threads)]
    for t in pool:
        t.start()
    for _ in range(rounds):
        start.wait()
        began = time.perf_counter()
        end.wait()
        out.latencies_ms.append((time.perf_counter() - began) * 1000)
        bar.update(1)
    for t in pool:
        t.join()
    bar.close()
    return out


def timed(n: int, op: Callable[[int], None], bar) -> tuple[list[float], float]:
    samples = []
    began = time.perf_counter()
    for i in range(n):
        t0 = time.perf_counter()
        op(i)
        samples.append((time.perf_counter() - t0) * 1000)
        if i % 16 == 15:
            bar.update(16)
    wall = time.perf_counter() - began
    bar.close()
    return samples, wall


def run(ctx) -> None:
    chosen = ctx.options.get("scenario") or list(SCENARIOS)
    pfx = streams.prefix(ctx.run_id, "agg")
    base = pfx[len("bench:"):]  # aggregate ids; the bench states' prefix "bench:" completes the stream id
    cache.clear()
    try:
        for name in chosen:
            SCENARIO_FUNCS[name](ctx, f"{base}{name}:")
    finally:
        if not ctx.options.get("keep"):
            streams.remove(pfx)
        cache.clear()


def _check_stream(ctx, what: str, stream: str, expected_events: int) -> None:
    ctx.verify(f"{what}: events in {stream}", expected_events, streams.count_events(stream))
    ctx.verify(f"{what}: streams with gaps", 0, streams.check_contiguous(stream))


def _sequential(ctx, scenario: str, n: int, samples: list[float], wall: float, commits: int, **extra) -> None:
    ordered = sorted(samples)
    ctx.record(scenario, {"iterations": n}, throughput=n / wall, unit="ops/s", latencies_ms=samples, count=n,
               effective_commits_per_s=(commits / wall) if commits else None,
               p50_us=round(ordered[len(ordered) // 2] * 1000, 1), **extra)


def raw_append(ctx, base: str) -> None:
    """The journal's own guarded append of one event, no aggregate: the floor single-commit sits on."""
    n = ctx.options["iterations"]
    stream = f"bench:{base}0"
    env = Envelope("Incremented", {"by": 1})
    samples, wall = timed(n, lambda i: Event.objects.append(stream, env, expected_seq=i - 1),
                          ctx.progress(n, "raw append"))
    _check_stream(ctx, "raw-append", stream, n)
    _sequential(ctx, "raw-append", n, samples, wall, n, verified_rows=n)


def single_commit(ctx, base: str) -> None:
    n = ctx.options["iterations"]
    agg_id = f"{base}0"
    do(increment, agg_id, {"by": 1})  # first commit creates the stream and warms the cache
    samples, wall = timed(n, lambda i: do(increment, agg_id, {"by": 1}), ctx.progress(n, "single commit"))
    _check_stream(ctx, "single-commit", counter.stream(agg_id), n + 1)
    ctx.verify("single-commit: folded count", n + 1, load(counter, agg_id, fresh=True).state.count)
    _sequential(ctx, "single-commit", n, samples, wall, n, verified_rows=n + 1)


def single_commit_versioned(ctx, base: str) -> None:
    n = ctx.options["iterations"]
    agg_id = f"{base}0"
    do(increment_v2, agg_id, {"by": 1})
    samples, wall = timed(n, lambda i: do(increment_v2, agg_id, {"by": 1}), ctx.progress(n, "versioned commit"))
    _check_stream(ctx, "single-commit-versioned", versioned.stream(agg_id), n + 1)
    _sequential(ctx, "single-commit-versioned", n, samples, wall, n, verified_rows=n + 1,
                deprecated_names=len(versioned.deprecated))


def warm_load(ctx, base: str) -> None:
    n = ctx.options["iterations"]
    agg_id = f"{base}0"
    for _ in range(10):
        do(increment, agg_id, {"by": 1})
    with CaptureQueriesContext(connection) as queries:
        samples, wall = timed(n, lambda i: load(counter, agg_id), ctx.progress(n, "warm load"))
    ctx.verify("warm-load: queries during cached loads", 0, len(queries))
    ctx.verify("warm-load: cached version = journal tip", Event.objects.tip(counter.stream(agg_id)),
               load(counter, agg_id).version)
    _sequential(ctx, "warm-load", n, samples, wall, 0, queries=len(queries))


def cold_replay(ctx, base: str) -> None:
    n = ctx.options["iterations"]
    agg_id = f"{base}0"
    stream = counter.stream(agg_id)
    Event.objects.append(stream, [Envelope("Incremented", {"by": 1})] * 100, expected_seq=-1)
    key = (counter.name, stream)
    versions = set()

    def op(i: int) -> None:
        cache.discard(key)
        agg = load(counter, agg_id)
        versions.add((agg.state.count, agg.version))

    samples, wall = timed(n, op, ctx.progress(n, "cold replay"))
    _check_stream(ctx, "cold-replay-100", stream, 100)
    ctx.verify("cold-replay-100: distinct replay results", 1, len(versions))
    ctx.verify("cold-replay-100: replayed count", 100, versions.pop()[0])
    _sequential(ctx, "cold-replay-100", n, samples, wall, 0, events_replayed=100)


def commit_load(ctx, base: str) -> None:
    n = ctx.options["iterations"]
    agg_id = f"{base}0"

    def op(i: int) -> None:
        do(increment, agg_id, {"by": 1})
        load(counter, agg_id)

    samples, wall = timed(n, op, ctx.progress(n, "commit+load"))
    _check_stream(ctx, "commit-load", counter.stream(agg_id), n)
    _sequential(ctx, "commit-load", n, samples, wall, n, verified_rows=n)


def _batch(ctx, scenario: str, params: dict, batches: Batches, per_batch: int, **extra) -> None:
    raise_errors(f"{scenario}: {len(batches.errors)} errors, e.g.", batches.errors)
    rounds = len(batches.latencies_ms)
    ctx.record(scenario, params, throughput=rounds / batches.wall_s, unit="batches/s",
               latencies_ms=batches.latencies_ms, count=batches.units,
               effective_commits_per_s=batches.units / batches.wall_s, commits_per_batch=per_batch, **extra)


def fanout(ctx, base: str) -> None:
    threads, rounds = ctx.options["fanout"], ctx.options["rounds"]
    batches = run_rounds(threads, rounds, lambda w, r: (do(increment, f"{base}{w}", {"by": 1}), 1)[1],
                         ctx.progress(rounds, f"{threads} concurrent commits"))
    ctx.verify("fanout-50: commits reported vs journal rows", batches.units, streams.count_events(f"bench:{base}"))
    ctx.verify("fanout-50: streams with gaps", 0, streams.check_contiguous(f"bench:{base}"))
    _batch(ctx, "fanout-50", {"threads": threads, "rounds": rounds}, batches, threads,
           verified_rows=batches.units)


def contended(ctx, base: str) -> None:
    threads, rounds = ctx.options["contenders"], ctx.options["rounds"]
    conflicts = Tally()

    def op(w: int, r: int) -> int:
        do_with_retry(increment, f"{base}{r}", {"by": 1}, attempts=200, backoff_ms=0.5, on_conflict=conflicts.add)
        return 1

    batches = run_rounds(threads, rounds, op, ctx.progress(rounds, f"{threads} contended commits"))
    ctx.verify("contended-20: commits reported vs journal rows", batches.units,
               streams.count_events(f"bench:{base}"))
    ctx.verify("contended-20: streams with gaps", 0, streams.check_contiguous(f"bench:{base}"))
    for r in range(rounds):
        ctx.verify(f"contended-20: round {r} events", threads, Event.objects.tip(counter.stream(f"{base}{r}")) + 1)
    _batch(ctx, "contended-20", {"threads": threads, "rounds": rounds}, batches, threads,
           verified_rows=batches.units, retries=conflicts.count, retries_per_commit=conflicts.count / batches.units)


def ticket_workflow(ctx, base: str) -> None:
    n = ctx.options["iterations"]

    def op(i: int) -> None:
        agg_id = f"{base}{i}"
        do(open_ticket, agg_id, {"title": f"ticket {i}"}, actor="bench")
        do(assign, agg_id, {"to": "agent"}, actor="bench")
        do(close, agg_id, {"resolution": "fixed"}, actor="bench")

    samples, wall = timed(n, op, ctx.progress(n, "ticket workflow"))
    ctx.verify("ticket-workflow: events", 3 * n, streams.count_events(f"bench:{base}"))
    ctx.verify("ticket-workflow: streams with gaps", 0, streams.check_contiguous(f"bench:{base}"))
    closed = Event.objects.filter(stream_id__startswith=f"bench:{base}", seq=2, type="TicketClosed").count()
    ctx.verify("ticket-workflow: closed tickets", n, closed)
    ctx.record("ticket-workflow", {"iterations": n, "actions": 3, "invariants": 2}, throughput=n / wall,
               unit="workflows/s", latencies_ms=samples, count=n, effective_commits_per_s=3 * n / wall,
               verified_rows=3 * n)


def shared_inventory(ctx, base: str) -> None:
    threads, rounds, stock = ctx.options["reservations"], ctx.options["rounds"], ctx.options["stock"]
    for r in range(rounds):
        do(restock, f"{base}{r}", {"quantity": stock})
    refused, conflicts = Tally(), Tally()

    def op(w: int, r: int) -> int:
        try:
            do_with_retry(reserve, f"{base}{r}", {"request": f"{r}-{w}"}, attempts=200, backoff_ms=0.5,
                          on_conflict=conflicts.add)
        except InvariantViolated:
            refused.add()
            return 0
        return 1

    batches = run_rounds(threads, rounds, op, ctx.progress(rounds, f"{threads} contending reservations"))
    granted = min(threads, stock)
    ctx.verify("shared-inventory: reservations committed", rounds * granted, batches.units)
    ctx.verify("shared-inventory: refused by the invariant", rounds * max(0, threads - stock), refused.count)
    ctx.verify("shared-inventory: journal rows", rounds * (1 + granted), streams.count_events(f"bench:{base}"))
    ctx.verify("shared-inventory: streams with gaps", 0, streams.check_contiguous(f"bench:{base}"))
    cache.clear()
    left = {load(inventory, f"{base}{r}").state.stock for r in range(rounds)}
    ctx.verify("shared-inventory: stock left per round", stock - granted, min(left))
    ctx.verify("shared-inventory: stock never below zero", 1, int(min(left) >= 0 and len(left) == 1))
    _batch(ctx, "shared-inventory", {"threads": threads, "rounds": rounds, "stock": stock}, batches, granted,
           verified_rows=batches.units, refused=refused.count, retries=conflicts.count)


def calculator_session(ctx, base: str) -> None:
    """10 presses on a new calculator, then correlate + drain a projection of every press, per session."""
    try:
        from projections.declarations import Consumer, Registry
        from projections.service import drain
    except ImportError as exc:
        ctx.log(f"calculator-session: projections not importable ({exc}); skipped")
        return
    n = max(1, ctx.options["iterations"] // 5)
    source = f"bench:{base}"
    seen: dict[str, list[int]] = {}

    def project(event, target) -> None:
        seen.setdefault(event.stream_id, []).append(event.seq)

    reg = Registry()
    reg.add(Consumer(f"bench-calculator-{ctx.run_id}", frozenset({"DigitPressed", "OperatorPressed"}),
                     handler=project, source=source, kind="projection"))
    drain(reg=reg)  # a new consumer first catches up the log's history: outside the timed window

    def op(i: int) -> None:
        agg_id = f"{base}{i}"
        for key in KEYS:
            if key.isdigit():
                do(press_digit, agg_id, {"digit": int(key)}, actor="bench")
            else:
                do(press_operator, agg_id, {"operator": key}, actor="bench")
        drain(reg=reg)

    samples, wall = timed(n, op, ctx.progress(n, "calculator session"))
    ctx.verify("calculator-session: events", 10 * n, streams.count_events(source))
    ctx.verify("calculator-session: streams with gaps", 0, streams.check_contiguous(source))
    ctx.verify("calculator-session: sessions projected", n, len(seen))
    ctx.verify("calculator-session: presses projected exactly once in order", 1,
               int(all(seqs == list(range(10)) for seqs in seen.values())))
    ctx.verify("calculator-session: final display 5 (92 before the last press)", 1,
               int(load(calculator, f"{base}0").state.display == "5"))
    ctx.record("calculator-session", {"iterations": n, "actions": 10}, throughput=n / wall, unit="sessions/s",
               latencies_ms=samples, count=n, effective_commits_per_s=10 * n / wall, verified_rows=10 * n)


SCENARIO_FUNCS = {
    "raw-append": raw_append,
    "single-commit": single_commit,
    "single-commit-versioned": single_commit_versioned,
    "warm-load": warm_load,
    "cold-replay-100": cold_replay,
    "commit-load": commit_load,
    "fanout-50": fanout,
    "contended-20": contended,
    "ticket-workflow": ticket_workflow,
    "shared-inventory": shared_inventory,
    "calculator-session": calculator_session,
}
