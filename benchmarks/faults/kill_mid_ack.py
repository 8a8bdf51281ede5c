"""kill-mid-ack: a drain process is SIGKILLed after a projection applied a whole batch but before
the ack that commits it with its writes; then another after a non-atomic reaction's effect but
before the cycle's ack; a fresh drain process finishes (see kill_mid_batch for the method).

Invariants: the projections applied every event exactly once (the writes went with the unsent ack),
the reaction at least once (its effect is re-done: at-least-once, counted as re-deliveries)."""

from __future__ import annotations

from benchmarks.faults import kill_mid_batch
from benchmarks.faults.base import Round, Verdict

NAME = "kill-mid-ack"
POSTGRES_ONLY = True


def run(r: Round) -> Verdict:
    return kill_mid_batch.run(r, points=("ack", "loose"))
