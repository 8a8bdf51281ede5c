"""django-q2 tasks of the leases app: queued executions and the minute-grained recovery backstop.

    from leases.tasks import enqueue_start
    eid = enqueue_start("orders.fulfil", {"order": 7})   # the execution id; runs in a loom_worker

Tasks run in django-q2's worker processes (forked by the cluster of `manage.py loom_worker` or
`qcluster`); each gets its own lease keeper under its own worker id.

Why a queued start survives a killed worker within about a lease TTL (docs/workers.md):
- the execution id is fixed when the start is queued, so the task is idempotent: a second
  delivery of it finds the execution (ExecutionExists) and does nothing;
- so the broker may re-deliver early: Q_CLUSTER `retry` (the seconds a taken, unacknowledged task
  stays invisible) is set to about LOOM_LEASE_TTL (system check loom.W112). A start taken by a
  worker that died before it began is re-delivered after `retry`;
- a start that began is a running execution with a lease (or none yet, within the lazy grace):
  the recovery sweep of any worker takes it over once the lease expired, with a fence advance;
- the task has no django-q2 timeout (a durable run is bounded by its lease, not the broker): a
  re-delivery of a start still running is the no-op above, never a second run.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from leases.keeper import get_keeper
from leases.recovery import log_takeover, prune_workers, resume_one, sweep

SCHEDULE_NAME = "loom.recovery_sweep"
# Options of the backstop schedule's tasks: no success rows (it runs every minute on every cluster
# and would push real tasks out of django-q2's success list), no django-q2 timeout (the resumes
# it runs are bounded by their leases).
BACKSTOP_OPTIONS = {"save": False, "timeout": -1}

log = logging.getLogger("loom.worker")


def run_start(flow: str, input: Any, execution_id: str | None = None, meta: dict | None = None) -> dict:
    """Start a durable execution in this worker process (the body of a queued execution).

    A delivery that finds the execution already there (an earlier delivery began it, or it was
    started by other means) does nothing and reports its status: if that run's worker died, the
    recovery sweep finishes it."""
    from journal.flows import ExecutionExists, OwnershipLost, start

    began = time.monotonic()
    # A fresh start bootstraps at fence token 1 (journal/flows/runtime.py).
    log.info("start execution=%s flow=%s fence=1 (queued)", execution_id, flow)
    try:
        outcome = start(flow, input, execution_id=execution_id, meta=meta)
    except ExecutionExists as exists:
        log.info("duplicate execution=%s flow=%s: already %s, nothing to do", exists.execution_id, flow,
                 exists.status)
        return {"execution_id": exists.execution_id, "status": exists.status, "duplicate": True}
    except OwnershipLost as lost:
        log.warning("halted execution=%s flow=%s fence=1 duration=%.3fs: %s", execution_id, flow,
                    time.monotonic() - began, lost)
        raise
    except Exception:
        log.exception("error execution=%s flow=%s fence=1 duration=%.3fs", execution_id, flow,
                      time.monotonic() - began)
        raise
    duration = time.monotonic() - began
    if outcome.status == "failed":
        log.warning("failed execution=%s flow=%s fence=1 duration=%.3fs error=%s", outcome.execution_id, flow,
                    duration, outcome.error)
    else:
        log.info("%s execution=%s flow=%s fence=1 duration=%.3fs", outcome.status, outcome.execution_id, flow,
                 duration)
    return {"execution_id": outcome.execution_id, "status": outcome.status}


def enqueue_start(flow: str, input: Any, execution_id: str | None = None, meta: dict | None = None) -> str:
    """Queue a start for the worker cluster; returns the execution id (minted here when not given).

    The flow, the input and the id are checked now (UnknownFlow, InvalidInput), so a bad start is
    refused to the caller instead of failing later in a worker."""
    from django_q.tasks import async_task
    from ulid import ULID

    from journal.envelopes import check_new_stream_id
    from journal.exceptions import InvalidStream
    from journal.flows import InvalidInput
    from journal.flows.registry import get_flow

    definition = get_flow(flow)
    _, stored = definition.prepare(input)
    if execution_id is None:
        execution_id = str(ULID())
    else:
        try:
            check_new_stream_id(execution_id)
        except InvalidStream as exc:
            raise InvalidInput(str(exc)) from None
    async_task("leases.tasks.run_start", definition.name, stored, execution_id, meta,
               task_name=f"start {definition.name} {execution_id}"[:100], q_options={"timeout": -1})
    return execution_id


def recovery_sweep() -> int:
    """One takeover sweep and the resumes, in this process (django-q2 schedule: every minute)."""
    taken = sweep(get_keeper().worker_id)
    log_takeover(taken)
    for execution_id, _token in taken.taken:
        resume_one(execution_id, taken.flow_of.get(execution_id, "?"))
    prune_workers()
    return len(taken.taken)


def ensure_schedule() -> None:
    """Create (once) the every-minute django-q2 schedule of `recovery_sweep`, saving no successes."""
    from django_q.models import Schedule

    Schedule.objects.update_or_create(
        name=SCHEDULE_NAME,
        defaults={"func": "leases.tasks.recovery_sweep", "schedule_type": Schedule.MINUTES, "minutes": 1,
                  "repeats": -1, "kwargs": f"q_options={BACKSTOP_OPTIONS!r}"},
    )
