"""What the queues do when journal runs an execution again (journal.flows.runtime.RERUN_HOOKS) or cancels
one (CANCEL_HOOKS).

A retried execution was settled in its queue's eyes (its entry done, its slot free): it takes its slot
back before it runs, or the retry is refused (QueueFull) when the queue is at its cap (review R2). A
cancelled queued execution's pending entry is cancelled in the cancel's transaction (its dedup id freed,
the depth right); had a worker claimed it meanwhile, its runner finds the header cancelled and runs nothing.
"""

from __future__ import annotations

from queues.store import store_for


def reopen(execution_id: str, alias: str) -> None:
    """Count a retried queued execution against its queue's caps again (no-op if it is not queued)."""

    store_for(alias).reopen(execution_id)


def cancelled(execution_id: str, alias: str) -> None:
    """In journal.flows.cancel's transaction, after its settle: the execution's pending entry (if any) is
    cancelled with it, so it never begins (a runner that claimed it meanwhile finds the header cancelled)."""

    store_for(alias).cancel_pending(execution_id)


def removed(execution_ids: list[str], alias: str) -> None:
    """In a retention batch's transaction (journal.retention.REMOVE_HOOKS): the removed executions' entries go."""

    store_for(alias).drop_removed(execution_ids)
