"""The reactions and projections of the fault scenarios, for their child processes only
(LOOM_PROJECTION_MODULES=benchmarks.faults.declarations): importing this module declares them.

All follow `FaultTick` events on streams under `faults:`, in the default lane, each writing one
`loom_faults_applied` row per event it handles:

- `faults-each` (projection, per event; kill point `batch` after each event),
- `faults-batch` (projection, batch handler; kill point `ack` after the whole batch, before its ack),
- `faults-loose` (non-atomic reaction: at-least-once, so re-deliveries are expected, losses are not;
  kill point `loose` after its effect, before the cycle's ack),
- `faults-late` only when FAULTS_LATE=1: a projection deployed while the others are far ahead of it
  on the same streams (a rolling deploy), which starts from the beginning of every stream.
"""

from __future__ import annotations

import os

from benchmarks.faults.fixtures import TYPE, kill_point, record_applied
from projections.declarations import projection, reaction

SOURCE = "faults:"


def _each(event, target) -> None:
    record_applied("faults-each", event.stream_id, event.seq)
    kill_point("batch")


def _batch(events, target) -> None:
    for event in events:
        record_applied("faults-batch", event.stream_id, event.seq)
    kill_point("ack")


def _late(event, target) -> None:
    record_applied("faults-late", event.stream_id, event.seq)


projection("faults-each", on=[TYPE], handler=_each, source=SOURCE)
projection("faults-batch", on=[TYPE], batch=_batch, source=SOURCE)


@reaction("faults-loose", on=[TYPE], source=SOURCE, atomic=False)
def _loose(event, target) -> None:
    record_applied("faults-loose", event.stream_id, event.seq)
    kill_point("loose")


if os.environ.get("FAULTS_LATE") == "1":
    projection("faults-late", on=[TYPE], handler=_late, source=SOURCE)

CONSUMERS = ("faults-each", "faults-batch", "faults-loose", "faults-late")
EXACT = ("faults-each", "faults-batch", "faults-late")  # atomic: each event exactly once
