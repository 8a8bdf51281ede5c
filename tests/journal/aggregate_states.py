"""The bump counters of the compaction and re-snapshot tests (test_compaction.py, test_resnapshot.py, and the
child processes of compaction_scenarios.py, which import this module after django.setup()): a state folding
`Bumped` events, bumped by the action `Bump`. A State is registered by name once per process, so declaring a
name again returns the one already registered."""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel

from journal.aggregates import State
from journal.aggregates.declarations import states


class Count(BaseModel):
    n: int = 0


class Tally(BaseModel):
    """`bumps` is a field an older code did not have (its snapshots hold only `n`)."""

    n: int
    bumps: int


class Bumped(BaseModel):
    by: int = 1


class Bump(BaseModel):
    by: int = 1


def _declare(name: str, schema: type[BaseModel], patch: Callable[[BaseModel, Bumped], dict],
             **options) -> tuple[State, object]:
    existing = states().get(name)
    if existing is not None:
        return existing, existing.actions["Bump"]
    st = State(name, schema, **options)
    st.on(Bumped)(patch)

    @st.action(Bump)
    def bump(s: BaseModel, cmd: Bump) -> Bumped:
        return Bumped(by=cmd.by)

    return st, st.actions["Bump"]


def counter(name: str, **options) -> tuple[State, object]:
    """A state of `n`, the sum of the bumps: (the State, its Bump action)."""
    return _declare(name, Count, lambda s, e: {"n": s.n + e.by}, **options)


def tally(name: str, **options) -> tuple[State, object]:
    """A state of `n` and the number of `bumps` (from 0 and 0): (the State, its Bump action)."""
    return _declare(name, Tally, lambda s, e: {"n": s.n + e.by, "bumps": s.bumps + 1},
                    initial=Tally(n=0, bumps=0), **options)
