"""django-q2 tasks of the leases app: queued executions and the minute-grained recovery backstop.

    from leases.tasks import enqueue_start
    enqueue_start("orders.fulfil", {"order": 7}, execution_id="order-7")   # runs in a loom_worker

Tasks run in django-q2's worker processes (forked by the cluster of `manage.py loom_worker` or
`qcluster`); each gets its own lease keeper under its own worker id.
"""

from __future__ import annotations

from typing import Any

from leases.keeper import get_keeper
from leases.recovery import resume_one, sweep

SCHEDULE_NAME = "loom.recovery_sweep"


def run_start(flow: str, input: Any, execution_id: str | None = None) -> dict:
    """Start a durable execution in this worker process (the body of a queued execution)."""
    from journal.flows import start

    outcome = start(flow, input, execution_id=execution_id)
    return {"execution_id": outcome.execution_id, "status": outcome.status}


def enqueue_start(flow: str, input: Any, execution_id: str | None = None) -> str:
    """Queue a start for the worker cluster; returns django-q2's task id."""
    from django_q.tasks import async_task

    return async_task("leases.tasks.run_start", flow, input, execution_id, task_name=f"start {flow}")


def recovery_sweep() -> int:
    """One takeover sweep and the resumes, in this process (django-q2 schedule: every minute)."""
    taken = sweep(get_keeper().worker_id)
    for execution_id, _token in taken.taken:
        resume_one(execution_id)
    return len(taken.taken)


def ensure_schedule() -> None:
    """Create (once) the every-minute django-q2 schedule of `recovery_sweep`."""
    from django_q.models import Schedule

    Schedule.objects.get_or_create(
        name=SCHEDULE_NAME,
        defaults={"func": "leases.tasks.recovery_sweep", "schedule_type": Schedule.MINUTES, "minutes": 1,
                  "repeats": -1},
    )
