"""Section `effect-sweep`: where durable executions stop being write-bound.

1-step flows at `--sweep-concurrency` (32) with effect latencies 0, 1, 5, 25, 100 ms, run through
the coalescer as in `executions`. Each thread adds up its runs' wall time and the time inside the
effect; the write time is the rest (journal writes, including the wait in the coalescer, plus the
runtime's small overhead); the write share is write / (write + effect) over all threads.
That is aggregate work time, not a critical path: writes and effects of different runs overlap,
so each total may exceed the wall time. Above 50 % the runs are write-bound (a faster write
path, coalescing, would raise exec/s); below, the effect is the constraint. The crossover is
the effect latency at which the share crosses 50 %, interpolated between the two measured
latencies around it, and recorded as its own cell. Connections as in `executions` (none per thread).
"""

from __future__ import annotations

import itertools

from benchmarks.arguments import positive_int
from benchmarks.sections.executions import run_cell

EFFECTS_MS = (0.0, 1.0, 5.0, 25.0, 100.0)


def add_arguments(parser) -> None:
    parser.add_argument("--sweep-concurrency", type=positive_int, default=32, help="Concurrency of effect-sweep (32).")


def run(ctx) -> None:
    conc = ctx.options["sweep_concurrency"]
    shares: list[tuple[float, float]] = []
    for effect_ms in EFFECTS_MS:
        rounds = 6 if effect_ms <= 5 else 3 if effect_ms <= 25 else 2
        cell = run_cell(ctx, "effect-sweep", conc, rounds, effect_ms)
        work = cell["write_s"] + cell["effect_s"]
        share = cell["write_s"] / work if work else 0.0
        shares.append((effect_ms, share))
        ctx.record(f"effect {effect_ms:g} ms", {"concurrency": conc, "effect_ms": effect_ms, "rounds": rounds,
                                                "coalesce": True},
                   throughput=cell["exec_per_s"], unit="exec/s", latencies_ms=cell["latencies"],
                   count=cell["executions"], verified_rows=cell["events"],
                   events_per_execution=cell["events_per_execution"],
                   write_s=round(cell["write_s"], 3), effect_s=round(cell["effect_s"], 3),
                   write_share=round(share, 3), verdict="write-bound" if share > 0.5 else "effect-bound",
                   statements_per_execution=round(cell["statements"] / cell["executions"], 3),
                   control_statements_per_execution=round(cell["control_statements"] / cell["executions"], 3),
                   coalesced_statements_per_execution=round(cell["coalesced_statements"] / cell["executions"], 3),
                   requests_per_statement=cell["requests_per_statement"])
    crossover = _crossover(shares)
    ctx.record("crossover", {"concurrency": conc}, unit="ms",
               crossover_effect_ms=None if crossover is None else round(crossover, 2),
               note=_note(crossover, shares))


def _crossover(shares: list[tuple[float, float]]) -> float | None:
    """The effect latency where the write share falls through 50 %, linearly interpolated."""
    for (ms_a, a), (ms_b, b) in itertools.pairwise(shares):
        if a >= 0.5 > b:
            return ms_a + (a - 0.5) / (a - b) * (ms_b - ms_a)
    return None


def _note(crossover: float | None, shares: list[tuple[float, float]]) -> str:
    if crossover is not None:
        return f"write share crosses 50% at about {crossover:.1f} ms of effect latency"
    if all(share < 0.5 for _, share in shares):
        return "effect-bound at every measured latency (write share below 50% even at 0 ms)"
    return "write-bound at every measured latency (the crossover lies above 100 ms)"
