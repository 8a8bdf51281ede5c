"""What the queues do when journal runs an execution again (journal.flows.runtime.RERUN_HOOKS).

A retried execution was settled in its queue's eyes (its entry done, its slot free): it takes its slot
back before it runs, or the retry is refused (QueueFull) when the queue is at its cap (review R2).
"""

from __future__ import annotations


def reopen(execution_id: str, alias: str) -> None:
    """Count a retried queued execution against its queue's caps again (no-op if it is not queued)."""
    from queues.store import store_for

    store_for(alias).reopen(execution_id)
