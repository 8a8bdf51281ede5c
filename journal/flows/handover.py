"""Handing a run to a worker instead of running it here (the admin, the API: never in a web request).

    from journal.flows import hand_over
    hand_over("order-42")            # checks, then queues its resume for a worker; returns the fence handed over

`hand_over` checks in the caller (the execution exists and is not settled; nobody provably drives it
now, `force=True` aside) and queues `run_handed_over` on django-q2's queue (the cluster of
`manage.py loom_worker`), with the fence token it saw. The worker resumes the execution only from
that token (`resume(..., expected_fence=token)`): if anyone took the execution over in between (the
recovery sweep, another hand-over, a delivery of the same task twice), the fence has moved and the
task does nothing. So a hand-over never runs a step in the web process and never steals from a
run that started after it was queued.
"""

from __future__ import annotations

import logging

from journal import shards
from journal.flows.errors import NotResumable
from journal.flows.outcome import Outcome

log = logging.getLogger("loom.flows")


@shards.by_stream
def hand_over(execution_id: str, *, force: bool = False) -> int:
    """Queue a resume of a running (or stuck) execution on a worker; returns the fence token handed
    over. UnknownExecution, NotResumable (settled; no queue installed), ExecutionBusy (a live owner,
    unless force) are raised here, before anything is queued."""
    from journal.flows.runtime import check_not_live, header_of
    from journal.flows.state import TERMINAL
    from journal.models import Fence

    check_queue()
    status, _, _, _ = header_of(execution_id)
    if status in TERMINAL:
        raise NotResumable(f"execution {execution_id!r} already {status}; nothing to resume")
    # The fence as the liveness check saw it (read first): a waker's claim in between moves it, and the
    # handed-over resume (expected_fence=token) is then refused instead of fencing off the woken run.
    token = Fence.objects.current(execution_id)
    if not force:
        check_not_live(execution_id)
    enqueue_resume(execution_id, token, force=force)
    return token


def check_queue() -> None:
    """NotResumable unless django-q2 is installed (its cluster is what runs handed-over work)."""
    from django.apps import apps

    if not apps.is_installed("django_q"):
        raise NotResumable("no worker queue: add django_q to INSTALLED_APPS and run manage.py loom_worker "
                           "(docs/workers.md), or call resume() in a process of your own")


def enqueue_resume(execution_id: str, fence_token: int | None, *, force: bool = False) -> None:
    """Put the resume on django-q2's queue (no django-q2 timeout: a durable run is bounded by its
    lease, not by the broker)."""
    check_queue()
    from django_q.tasks import async_task

    async_task("journal.flows.handover.run_handed_over", execution_id, fence_token, force,
               task_name=f"resume {execution_id}"[:100], q_options={"timeout": -1})


@shards.by_stream
def run_handed_over(execution_id: str, fence_token: int | None, force: bool = False) -> dict:
    """The queued task: resume here from the handed-over fence token. A refusal (taken over since,
    settled, a live owner appeared) is logged and returned, not raised: re-running it would not help."""
    from journal.flows.errors import FlowError
    from journal.flows.runtime import resume

    try:
        outcome: Outcome = resume(execution_id, force=force, expected_fence=fence_token)
    except (NotResumable, FlowError) as exc:
        log.warning("handed-over resume of %s (fence %s) not run: %s", execution_id, fence_token, exc)
        return {"execution_id": execution_id, "status": "refused", "error": str(exc)}
    log.info("handed-over resume of %s (fence %s): %s", execution_id, fence_token, outcome.status)
    return {"execution_id": execution_id, "status": outcome.status, "error": outcome.error}
