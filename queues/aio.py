"""The queues app's awaitable faces, for async views: `aenqueue`, `acancel_pending`, `aentry_of`.

    from queues.aio import aenqueue, acancel_pending
    queued = await aenqueue("mail.send", {"to": "ann"}, queue="emails", dedup_id="welcome-7")
    await acancel_pending(queued.execution_id)        # before a worker began it: it never runs

Each runs its sync call (queues.enqueue, queues.cancel_pending, queues.entry_of) in a thread of the journal's
bounded pool (journal.flows.aio.in_pool: LOOM_ASYNC_DB_THREADS threads, one connection each at most, counted by
leases/budget.py), as `astart(..., queue=...)` does, so an async view never touches the database on its loop and
never needs sync_to_async. None of them waits: each holds a pool thread for one short transaction.

Why not Django's `sync_to_async(thread_sensitive=True)`: under Django's ASGI handler every request has a
thread-sensitive context of its own, so each concurrent caller would be one more thread and session outside
the budget. (The Tasks backend's `aenqueue`/`aget_result` keep Django's own path: queues/tasks.py says why.)
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from journal.flows.aio import in_pool
from queues import cancel_pending, entry_of
from queues.enqueuing import DEFAULT_QUEUE, Enqueued, enqueue


async def aenqueue(flow: Any, input: Any, queue: str = DEFAULT_QUEUE, *, execution_id: str | None = None,
                   partition_key: str | None = None, priority: int = 0, dedup_id: str | None = None,
                   run_after: datetime | None = None, meta: dict | None = None, timeout: float | None = None,
                   using: str | None = None) -> Enqueued:
    """`queues.enqueue()`, awaitable: the same checks, refusals and one transaction, in a pool thread."""
    return await in_pool(enqueue, flow, input, queue, execution_id=execution_id, partition_key=partition_key,
                         priority=priority, dedup_id=dedup_id, run_after=run_after, meta=meta, timeout=timeout,
                         using=using)


async def acancel_pending(execution_id: str, using: str | None = None) -> bool:
    """`queues.cancel_pending()`, awaitable: cancel a queued start whose run has not begun (and its execution)."""
    return await in_pool(cancel_pending, execution_id, using)


async def aentry_of(execution_id: str, using: str | None = None):
    """`queues.entry_of()`, awaitable: the execution's queue entry (queues.models.QueueEntry) or None."""
    return await in_pool(entry_of, execution_id, using)
