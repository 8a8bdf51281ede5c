"""Queues of durable starts: global and per-partition concurrency caps, rate limits, priorities,
deduplication ids and not-before times, enforced across every loom_worker (docs/queues.md).

    from queues import declare_queue, enqueue
    declare_queue("emails", concurrency=8, partition_concurrency=1)      # or LOOM_QUEUES in settings
    enqueue("mail.send", {"to": "ann"}, queue="emails", partition_key="customer-7", dedup_id="welcome-7")

Async views: `await queues.aenqueue(...)`, `acancel_pending`, `aentry_of` (queues/aio.py).

Modules: declarations (queues and their caps), enqueuing, aio (its awaitable faces), service (the worker's
dispatcher), store (all SQL, per backend), models, exceptions. Names that need the database load on first use.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from journal import shards
from journal.atomic import atomic
from journal.ids import stored_id_problem
from queues.declarations import QueueSpec, declare_queue
from queues.exceptions import InvalidEnqueue, InvalidQueue, QueueError, QueueFull, UnknownQueue
from queues.store import store_for

if TYPE_CHECKING:
    from queues.aio import acancel_pending, aenqueue, aentry_of
    from queues.enqueuing import Enqueued, enqueue
    from queues.service import run_due
    from queues.store.base import QueueStats

# The face of queues (tests/test_layout.py): what users and the apps above may import.
FACE_MODULES = ("queues.models", "queues.declarations", "queues.exceptions", "queues.store", "queues.tasks",
                "queues.aio")

_LAZY = {"enqueue": "queues.enqueuing", "Enqueued": "queues.enqueuing", "QueueStats": "queues.store.base",
         "run_due": "queues.service", "aenqueue": "queues.aio", "acancel_pending": "queues.aio",
         "aentry_of": "queues.aio"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'queues' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def stats(using: str | None = None, unreachable: dict[str, str] | None = None) -> list[QueueStats]:
    """Every queue with its caps, depth (pending, ready) and running count (admin, command line). With
    LOOM_SHARDS and no `using`: every shard's counts added up per queue (the caps shown are each shard's).
    Given `unreachable` (the admin), a shard whose connection fails is left out of the sums and named there
    (alias -> the error's first line) instead of failing the whole page."""
    from django.db import router

    from queues.models import Queue  # app registry: this face loads with INSTALLED_APPS, before the models

    if using is not None or not shards.sharded():
        return store_for(using or router.db_for_read(Queue)).queue_stats()
    merged: dict[str, QueueStats] = {}
    for found in shards.read_each(shards.shards(), lambda alias: store_for(alias).queue_stats(), unreachable):
        for one in found:
            seen = merged.get(one.name)
            merged[one.name] = one if seen is None else replace(
                seen, pending=seen.pending + one.pending, ready=seen.ready + one.ready,
                running=seen.running + one.running)
    return [merged[name] for name in sorted(merged)]


def _home(execution_id: str, using: str | None) -> str:
    """The database of an execution's entry: `using`, else its shard (the router's alias unsharded)."""
    from django.db import router

    from queues.models import QueueEntry  # app registry (as above)

    if using is not None:
        return using
    return shards.shard_for(execution_id) if shards.sharded() else router.db_for_write(QueueEntry)


def entry_of(execution_id: str, using: str | None = None):
    """The queue entry of an execution (queues.models.QueueEntry), or None (also for an id no entry can
    have: NUL, a lone surrogate, empty, too long, not a string). Read on the execution's shard."""
    from queues.models import QueueEntry  # app registry (as above)

    if stored_id_problem(execution_id) is not None:
        return None  # no entry can have an id the database cannot hold (review R5)
    return QueueEntry.objects.using(_home(execution_id, using)).filter(execution_id=execution_id).first()


def cancel_pending(execution_id: str, using: str | None = None) -> bool:
    """Cancel a queued start whose run has not begun (pending, or claimed by a worker that has not begun
    it: that worker then does not start it), and its queued execution with it (journal.flows.cancel, in the
    same transaction); False if its run has begun, it finished, or it is unknown."""
    from journal.flows import header_status  # app registry (imports journal.models)
    from journal.flows.queued import QUEUED  # app registry (imports journal.models)

    if stored_id_problem(execution_id) is not None:
        return False  # nothing to cancel: no entry can have an id the database cannot hold (review R5)
    alias = _home(execution_id, using)
    with atomic(alias):
        if not store_for(alias).cancel_pending(execution_id):
            return False
        header = header_status(execution_id)
        if header is not None and header[0] == QUEUED:
            from journal.flows import cancel

            cancel(execution_id, "cancelled before it began")
    return True


__all__ = ["Enqueued", "InvalidEnqueue", "InvalidQueue", "QueueError", "QueueFull", "QueueSpec", "QueueStats",
           "UnknownQueue", "acancel_pending", "aenqueue", "aentry_of", "cancel_pending", "declare_queue", "enqueue",
           "entry_of", "run_due", "stats"]
