"""Where other apps plug into the flow runtime: the seams, and the registration functions that fill them.

The journal names no app above it. The queues app gives `start(..., queue=)` and hand-overs their way in
(`set_queue_start`, `set_resume_queue`) and takes a retried execution's slot back (`add_rerun_hook`); leases
and queues act in a cancel's transaction (`add_cancel_hook`); each calls these from its ready(). The seams
live here, below the modules that run them (journal/flows/runtime.py, handover.py import this one; this one
imports neither), so that filling a seam never loads the engine and the engine never looks up a plugin's
module.
"""

from __future__ import annotations

from collections.abc import Callable

from journal.flows.errors import NotResumable, UnknownExecution
from journal.flows.writer import header_status

# The queues app's enqueue: start(..., queue=...) hands the start to it. Empty: the queues app is not installed.
QUEUE_STARTS: list = []
# The queues app's enqueue_resume: (execution_id, flow, fence, force=) -> bool. Empty: nothing can run a
# hand-over.
RESUME_QUEUES: list = []
# Callables (execution_id, alias) run in a retry's transaction once the header is back to running; one that
# raises refuses the retry (nothing written). The queues app: a queued execution is counted against its
# queue's cap again, or refused when the queue is full.
RERUN_HOOKS: list = []
# Callables (execution_id, alias) run in a cancel's transaction, after its settle: the leases app deletes the
# execution's lease row there (the cancel's fence advance fenced every holder off: the row is no one's, and
# no sweep would ever look at it again, since recovery reads running executions only); the queues app
# cancels its pending entry (a queued execution's entry never begins, its dedup id is free, the depth right).
CANCEL_HOOKS: list = []


def set_queue_start(enqueue: Callable) -> None:
    """`journal.flows.start(..., queue=)` hands its start to `enqueue` (the queues app's; none: refused)."""
    QUEUE_STARTS[:] = [enqueue]


def set_resume_queue(enqueue_resume: Callable) -> None:
    """Hand-overs and `retry(handoff=True)` queue their resume with `enqueue_resume(execution_id, flow,
    fence, force=) -> bool`."""
    RESUME_QUEUES[:] = [enqueue_resume]


def add_rerun_hook(hook: Callable[[str, str], None]) -> None:
    """Run `hook(execution_id, alias)` in a retry's transaction (one that raises refuses the retry)."""
    if hook not in RERUN_HOOKS:
        RERUN_HOOKS.append(hook)


def add_cancel_hook(hook: Callable[[str, str], None]) -> None:
    """Run `hook(execution_id, alias)` in a cancel's transaction."""
    if hook not in CANCEL_HOOKS:
        CANCEL_HOOKS.append(hook)


# -- the runtime's side of the resume queue (hand_over, retry(handoff=True)) --------------------------------
def check_queue() -> None:
    """NotResumable unless the queues app is installed (its workers' dispatchers run handed-over work)."""
    if not RESUME_QUEUES:
        raise NotResumable("no worker queue: add queues to INSTALLED_APPS and run manage.py loom_worker "
                           "(docs/workers.md), or call resume() in a process of your own")


def enqueue_resume(execution_id: str, fence_token: int | None, *, force: bool = False,
                   flow: str | None = None) -> None:
    """Put the resume on the execution's queue (a resume entry from `fence_token`); NotResumable if the
    execution is queued (its start entry is pending: nothing to hand over)."""
    check_queue()
    if flow is None:
        header = header_status(execution_id)
        if header is None:
            raise UnknownExecution(execution_id)
        flow = header[1]
    if not RESUME_QUEUES[0](execution_id, flow, fence_token, force=force):
        raise NotResumable(f"execution {execution_id!r} is queued: a worker begins it within its queue's caps")
