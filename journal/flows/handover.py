"""Handing a run to a worker instead of running it here (the admin, the API: never in a web request).

    from journal.flows import hand_over
    hand_over("order-42")            # checks, then queues its resume for a worker; returns the fence handed over

`hand_over` checks in the caller (the execution exists and is not settled or queued; nobody provably drives
it now, `force=True` aside) and queues a resume entry, with the fence token it saw, on the queue of the
execution's entry (else the default queue): the one leased queue every start uses, so a hand-over obeys
that queue's caps and any loom_worker's dispatcher runs it (queues.enqueuing.enqueue_resume, put in
journal/flows/plugins.py by the queues app: the journal names no app above it). The worker resumes the
execution only from that token (`resume(..., expected_fence=token)`): if anyone took the execution over in
between (the recovery sweep, another hand-over, the entry offered twice), the fence has moved and the resume does
nothing. So a hand-over never runs a step in the web process and never steals from a run that started after it.

`run_handed_over` stays as the body of django-q2 tasks queued before hand-overs went to the queue: such a
task, delivered after the upgrade, is routed into the queue (a resume entry from its fence), so it runs
once, under the queue's caps.
"""

from __future__ import annotations

import logging

from journal import shards
from journal.flows import runtime
from journal.flows.errors import FlowError, NotResumable
from journal.flows.plugins import RESUME_QUEUES, check_queue, enqueue_resume
from journal.flows.queued import QUEUED
from journal.flows.state import TERMINAL
from journal.models import Fence

log = logging.getLogger("loom.flows")

# RESUME_QUEUES (the queues app's enqueue_resume), check_queue and enqueue_resume live in
# journal/flows/plugins.py, below the runtime (retry(handoff=True) queues its resume there too); named here
# for the callers that knew them here.
__all__ = ["RESUME_QUEUES", "check_queue", "enqueue_resume", "hand_over", "run_handed_over"]


@shards.by_stream
def hand_over(execution_id: str, *, force: bool = False) -> int:
    """Queue a resume of a running (or stuck, waiting, suspended) execution on a worker; returns the fence
    token handed over. UnknownExecution, NotResumable (settled; queued: a worker begins it anyway; no queue
    installed), ExecutionBusy (a live owner, unless force) are raised here, before anything is queued."""
    check_queue()
    status, flow, _, _ = runtime.header_of(execution_id)
    if status in TERMINAL:
        raise NotResumable(f"execution {execution_id!r} already {status}; nothing to resume")
    if status == QUEUED:
        raise NotResumable(f"execution {execution_id!r} is queued: a worker begins it within its queue's caps")
    # The fence as the liveness check saw it (read first): a waker's claim in between moves it, and the
    # handed-over resume (expected_fence=token) is then refused instead of fencing off the woken run.
    token = Fence.objects.current(execution_id)
    if not force:
        runtime.check_not_live(execution_id)
    enqueue_resume(execution_id, token, force=force, flow=flow)
    return token


@shards.by_stream
def run_handed_over(execution_id: str, fence_token: int | None, force: bool = False) -> dict:
    """A django-q2 task queued before hand-overs went to the queue: routed into it (a resume entry from the
    handed-over fence, run by a loom_worker's dispatcher). A refusal is logged and returned, not raised."""
    try:
        enqueue_resume(execution_id, fence_token, force=force)
    except (NotResumable, FlowError) as exc:
        log.warning("old-scheme handed-over resume of %s (fence %s) not queued: %s", execution_id, fence_token, exc)
        return {"execution_id": execution_id, "status": "refused", "error": str(exc)}
    log.info("old-scheme handed-over resume of %s (fence %s): queued", execution_id, fence_token)
    return {"execution_id": execution_id, "status": "queued", "error": None}
