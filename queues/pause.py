"""Pause and resume a queue's dispatch (the operations page, the queue admin, `loom queues pause|resume`).

A pause is the queue row's `paused_at` (durable, on every shard that has the row): every dispatcher on every
host reads it under the queue's row lock in its dequeue, so once pause() returns no entry of the queue is
claimed until resume(). Enqueues are still accepted (they wait, pending); entries already claimed run on;
a cancel of a pending entry works as ever. A run-now of a schedule on a paused queue enqueues its entry,
which waits for the resume like any other (leases/schedule_ops.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import router

from journal import shards
from journal.ids import stored_id_problem
from queues.declarations import ensure_queue
from queues.exceptions import UnknownQueue
from queues.models import Queue
from queues.store import store_for


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a pause or resume did: `changed` False when the queue already was in that state."""

    queue: str
    paused: bool
    changed: bool


def _aliases(using: str | None) -> list[str]:
    if using is not None:
        return [using]
    return shards.shards() if shards.sharded() else [router.db_for_write(Queue)]


def check_name(name: object) -> str:
    """A queue name as the rows have it; UnknownQueue (nothing written) for anything else, a NUL or lone
    surrogate too (PostgreSQL cannot take it as text: a DataError, the page's 500)."""
    if not isinstance(name, str) or len(name) > 100 or stored_id_problem(name) is not None:
        raise UnknownQueue(f"no queue named {name!r}")
    return name


def pause(name: str, by: str = "", using: str | None = None) -> Outcome:
    """Pause the queue on every shard that has its row; UnknownQueue (nothing written) if none has."""

    name = check_name(name)
    aliases = _aliases(using)
    for alias in aliases:  # a queue this process declares may have no row yet: write it, so the pause holds
        ensure_queue(name, alias)  # UnknownQueue (nothing written): neither declared here nor a row there
    found = [store_for(alias).pause_queue(name, by[:200]) for alias in aliases]
    if all(result is None for result in found):
        raise UnknownQueue(f"no queue named {name!r}")
    return Outcome(name, True, any(found))


def resume(name: str, using: str | None = None) -> Outcome:
    """Resume the queue's dispatch on every shard; idle dispatchers see it at their next poll."""

    name = check_name(name)
    found = [store_for(alias).resume_queue(name) for alias in _aliases(using)]
    if all(result is None for result in found):
        raise UnknownQueue(f"no queue named {name!r}")
    return Outcome(name, False, any(found))


def paused(using: str | None = None) -> dict[str, tuple]:
    """Paused queues: name -> (paused_at, paused_by), as the first database that has the row says."""

    out: dict[str, tuple] = {}
    for alias in _aliases(using):
        for name, at, by in Queue.objects.using(alias).filter(paused_at__isnull=False).values_list(
                "name", "paused_at", "paused_by"):
            out.setdefault(name, (at, by))
    return out
