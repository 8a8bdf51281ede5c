"""What a fault scenario is given and returns: one round, its options, its random kill points.

A scenario is a module of this package with `NAME`, `POSTGRES_ONLY` (bool), an optional
`cannot_run(options) -> str | None` (why it must skip here) and `run(round: Round) -> Verdict`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.faults.checks import Verdict
from benchmarks.faults.processes import Child, Pool, child_env


@dataclass
class Round:
    """One repetition of one scenario: its stream prefix, working folder, options and RNG."""

    scenario: str
    index: int
    prefix: str  # every stream and execution id of the round starts with it ("faults:<run>:<scenario>:<i>:")
    folder: Path
    options: dict
    rng: random.Random
    log: Callable[[str], None]
    params: dict = field(default_factory=dict)  # the round's sizes and kill points, recorded with it
    figures: dict = field(default_factory=dict)  # extra figures to record (durations, conflicts...)
    verdict: Verdict = field(default_factory=Verdict)  # filled as the round goes (kept if it fails midway)
    started: float = field(default_factory=time.monotonic)

    def pool(self) -> Pool:
        return Pool(self.folder)

    def env(self, **extra: str) -> dict[str, str]:
        return child_env(**extra)

    def opt(self, name: str) -> int:
        return int(self.options[name])

    @property
    def bound(self) -> float:
        """Seconds a recovery may take before what is not done counts as stuck."""
        return float(self.options["bound"])


def acks(children: list[Child]) -> list[tuple[str, int, int]]:
    """Every (stream, first seq, last seq) the children were told was stored."""
    return [(p[1], int(p[2]), int(p[3])) for c in children for p in c.said("ACK")]


def finish(children: list[Child], timeout: float) -> None:
    """Wait for children that must end by themselves, failing the round on an error exit."""
    for child in children:
        code = child.wait(timeout)
        if code != 0:
            raise AssertionError(f"{child.name} exited with {code}:\n{child.tail()}")


def drained(prefix: str, consumers: int) -> bool:
    """Every FaultTick stream under `prefix` has a subscription per consumer, all caught up, none claimed:
    the drains have nothing left to do (whether or not they did it right is for the checks)."""
    from django.db.models import F

    from benchmarks.faults.fixtures import TYPE
    from journal.models import Event
    from projections.models import Subscription

    streams = Event.objects.filter(stream_id__startswith=prefix, type=TYPE).values("stream_id").distinct().count()
    subs = Subscription.objects.filter(stream__startswith=prefix)
    return (subs.count() >= streams * consumers and not subs.filter(at__lt=F("tip")).exists()
            and not subs.exclude(leased_by=None).exists())


def settle(predicate: Callable[[], bool], timeout: float, quiet: float = 0.6) -> bool:
    """Wait until `predicate` holds twice, `quiet` s apart (nothing moved in between), or `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            time.sleep(quiet)
            if predicate():
                return True
        time.sleep(0.1)
    return False


def streams_of(r: Round, who: str, n: int) -> list[str]:
    return [f"{r.prefix}{who}-s{k}" for k in range(n)]


__all__ = ["Round", "Verdict", "acks", "drained", "finish", "settle", "streams_of"]
