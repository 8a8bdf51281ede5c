"""An aggregate used by tests that commit from child processes (which import it by module path)."""

from __future__ import annotations

from pydantic import BaseModel

from journal.aggregates import State


class Count(BaseModel):
    n: int = 0


class Incremented(BaseModel):
    by: int


class Increment(BaseModel):
    by: int = 1


counter = State("TestHotCounter", Count)


@counter.on(Incremented)
def _incremented(state: Count, e: Incremented) -> dict:
    return {"n": state.n + e.by}


@counter.action(Increment)
def increment(state: Count, cmd: Increment) -> Incremented:
    return Incremented(by=cmd.by)


class SlowIncrement(BaseModel):
    by: int = 1
    ms: float = 3.0


@counter.action(SlowIncrement)
def slow_increment(state: Count, cmd: SlowIncrement) -> Incremented:
    """An action that takes a while (as one that validates against another service would): a wide window
    between reading the stream and appending to it, where other writers win the race."""
    import time

    time.sleep(cmd.ms / 1000)
    return Incremented(by=cmd.by)
