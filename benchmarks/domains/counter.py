"""A counter: one event (`Incremented`), the smallest aggregate; the hot-stream and commit-cost shape."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from journal.aggregates import Action, State


class Counter(BaseModel):
    count: int = 0


class Incremented(BaseModel):
    by: int


class Increment(BaseModel):
    by: int = Field(default=1, gt=0)


class SlowIncrement(BaseModel):
    by: int = Field(default=1, gt=0)
    ms: float = 3.0


class IncrementedV2(BaseModel):
    by: int
    source: str = "v2"


@dataclass(frozen=True)
class CounterDomain:
    state: State
    increment: Action[Counter, Any]
    slow_increment: Action[Counter, Any]


def declare(name: str, **options) -> CounterDomain:
    """A counter state named `name` (State options such as prefix=, snapshot_every= pass through)."""
    state = State(name, Counter, **options)

    @state.on(Incremented)
    def _incremented(s: Counter, e: Incremented) -> dict:
        return {"count": s.count + e.by}

    @state.action(Increment)
    def increment(s: Counter, cmd: Increment) -> Incremented:
        return Incremented(by=cmd.by)

    @state.action(SlowIncrement)
    def slow_increment(s: Counter, cmd: SlowIncrement) -> Incremented:
        """An action that takes a while (as one that validates against another service would): a wide window
        between reading the stream and appending to it, where other writers win the race."""
        time.sleep(cmd.ms / 1000)
        return Incremented(by=cmd.by)

    return CounterDomain(state, increment, slow_increment)


@dataclass(frozen=True)
class VersionedCounterDomain:
    state: State
    increment: Action[Counter, Any]


def declare_versioned(name: str, **options) -> VersionedCounterDomain:
    """The same counter with a deprecated v1 of its event in the registry (commits emit the current v2):
    the versioning check runs on every commit; the Act reference measured it as free."""
    state = State(name, Counter, **options)

    @state.upcast(Incremented, name="Incremented")
    def _v1_to_v2(payload: dict) -> dict:
        return {"by": payload["by"], "source": "v1"}

    @state.on(IncrementedV2, name="Incremented_v2")
    def _incremented_v2(s: Counter, e: IncrementedV2) -> dict:
        return {"count": s.count + e.by}

    @state.action(Increment, name="IncrementV2")
    def increment_v2(s: Counter, cmd: Increment) -> IncrementedV2:
        return IncrementedV2(by=cmd.by)

    return VersionedCounterDomain(state, increment_v2)
