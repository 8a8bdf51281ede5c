"""What the queues do when journal runs an execution again (journal.flows.runtime.RERUN_HOOKS) or cancels
one (CANCEL_HOOKS).

A retried execution was settled in its queue's eyes (its entry done, its slot free): it takes its slot
back before it runs, or the retry is refused (QueueFull) when the queue is at its cap (review R2). A
cancelled queued execution's pending entry is cancelled at once (its dedup id freed, the depth right); had
a worker claimed it meanwhile, its runner finds the header cancelled and runs nothing.
"""

from __future__ import annotations


def reopen(execution_id: str, alias: str) -> None:
    """Count a retried queued execution against its queue's caps again (no-op if it is not queued)."""
    from queues.store import store_for

    store_for(alias).reopen(execution_id)


def cancelled(execution_id: str) -> None:
    """After journal.flows.cancel settled an execution: its pending entry (if any) never begins. Best
    effort (the cancel has committed): a failure is logged, and the dequeue treats the entry as done."""
    import logging

    from django.db import DatabaseError

    from queues import _home
    from queues.store import store_for

    try:
        store_for(_home(execution_id, None)).cancel_pending(execution_id)
    except DatabaseError:
        logging.getLogger("loom.queues").exception("the entry of cancelled execution %s stays pending until a "
                                                   "dequeue finds its header settled", execution_id)
