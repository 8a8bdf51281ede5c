"""Where other apps plug into the flow runtime: registration functions, called from their ready().

The journal names no app above it. The queues app gives `start(..., queue=)` and hand-overs their way in
(`set_queue_start`, `set_resume_queue`) and takes a retried execution's slot back (`add_rerun_hook`); leases
and queues act in a cancel's transaction (`add_cancel_hook`). The lists stay in the modules that run them
(journal/flows/runtime.py, handover.py); this module is the one way to fill them.
"""

from __future__ import annotations

from collections.abc import Callable

from journal.flows import handover, runtime


def set_queue_start(enqueue: Callable) -> None:
    """`journal.flows.start(..., queue=)` hands its start to `enqueue` (the queues app's; none: refused)."""
    runtime.QUEUE_STARTS[:] = [enqueue]


def set_resume_queue(enqueue_resume: Callable) -> None:
    """Hand-overs and `retry(handoff=True)` queue their resume with `enqueue_resume(execution_id, flow,
    fence, force=) -> bool`."""
    handover.RESUME_QUEUES[:] = [enqueue_resume]


def add_rerun_hook(hook: Callable[[str, str], None]) -> None:
    """Run `hook(execution_id, alias)` in a retry's transaction (one that raises refuses the retry)."""
    if hook not in runtime.RERUN_HOOKS:
        runtime.RERUN_HOOKS.append(hook)


def add_cancel_hook(hook: Callable[[str, str], None]) -> None:
    """Run `hook(execution_id, alias)` in a cancel's transaction."""
    if hook not in runtime.CANCEL_HOOKS:
        runtime.CANCEL_HOOKS.append(hook)
