"""What the reaction sections share: removing a section's consumers, waiting for handlers, the wake-up.

Each reaction section declares its own consumers in the process registry, starts them at the log's tip
(no history scan), verifies what the handlers saw against the journal, then removes its consumers,
subscriptions, checkpoints and (unless --keep) its streams with `cleanup`.
"""

from __future__ import annotations

import time

from benchmarks import streams
from journal.models import Event
from projections.declarations import registry
from projections.models import Checkpoint, Subscription
from projections.store import store_for


def cleanup(ctx, names: list[str], prefix: str | None) -> None:
    for name in names:
        registry.remove(name)
    Subscription.objects.filter(consumer__in=names).delete()
    Checkpoint.objects.filter(consumer__in=names).delete()
    if prefix and not ctx.options.get("keep"):
        streams.remove(prefix)
    registry.lanes = {k: v for k, v in registry.lanes.items() if k == "default" or registry.in_lane(k)}


def wakeup(ctx) -> str:
    return "notify" if ctx.vendor == "postgresql" else "poll 5 ms"


def wait(condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError("bench_reactions: timed out waiting for the handlers")
        time.sleep(0.0005)


def subscribe(name: str, sids: list[str]) -> None:
    c = registry.consumers[name]
    store_for().bump([(name, sid, c.source, c.lane, c.priority, Event.objects.tip(sid)) for sid in sids])
