"""The bump counters of the compaction and re-snapshot tests (test_compaction.py, test_resnapshot.py, and the
child processes of compaction_scenarios.py, which import this module after django.setup()): a state folding
`Bumped` events, bumped by the action `Bump`. A State is registered by name once per process, so declaring a
name again returns the one already registered."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable

from django.db import connections
from pydantic import BaseModel

from journal.aggregates import State, do_with_retry
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


def race(bump, id: str, *works: Callable[[], object], writes: list[int] | None = None) -> list[BaseException]:
    """Real commits in threads: two writers `bump` aggregate `id` 40 times each (retried on a conflict; `writes[0]`
    and `writes[1]` count each one's, if given), and each of `works` runs over and over in a thread of its own until
    the writers are done. The errors the threads raised."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def guarded(fn: Callable[[], object]) -> None:
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    def writer(slot: int) -> None:
        for _ in range(40):
            do_with_retry(bump, id, {"by": 1}, attempts=50)
            if writes is not None:
                writes[slot] += 1

    def loop(work: Callable[[], object]) -> None:
        while not stop.is_set():
            work()

    writers = [threading.Thread(target=guarded, args=(functools.partial(writer, slot),)) for slot in range(2)]
    others = [threading.Thread(target=guarded, args=(functools.partial(loop, work),)) for work in works]
    for thread in writers + others:
        thread.start()
    for thread in writers:
        thread.join(120)
    stop.set()
    for thread in others:
        thread.join(60)
    return errors
