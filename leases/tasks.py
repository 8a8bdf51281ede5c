"""django-q2 tasks of the leases app: queued executions and the minute-grained recovery backstop.

    from leases.tasks import enqueue_start
    eid = enqueue_start("orders.fulfil", {"order": 7})   # the execution id; runs in a loom_worker

Tasks run in django-q2's worker processes (forked by the cluster of `manage.py loom_worker` or
`qcluster`); each gets its own lease keeper under its own worker id.

Why a queued start survives a killed worker within about a lease TTL (docs/workers.md):
- the execution id is fixed and reserved (leases.StartReservation) when the start is queued, so
  the task is idempotent: a second delivery of it finds the execution (ExecutionExists) and does
  nothing, and a task that is not the reserved start does nothing either;
- a task that raised is not acknowledged (Q_CLUSTER max_attempts 0, check loom.W115): the broker
  delivers it again after `retry`, maybe to a worker that has the flow;
- so the broker may re-deliver early: Q_CLUSTER `retry` (the seconds a taken, unacknowledged task
  stays invisible) is set to about LOOM_LEASE_TTL (system check loom.W112). A start taken by a
  worker that died before it began is re-delivered after `retry`;
- a start that began is a running execution with a lease (or none yet, within the lazy grace):
  the recovery sweep of any worker takes it over once the lease expired, with a fence advance;
- the task has no django-q2 timeout (a durable run is bounded by its lease, not the broker): a
  re-delivery of a start still running is the no-op above, never a second run.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import router, transaction
from django.utils.crypto import salted_hmac

from journal import shards
from journal.atomic import atomic
from leases.keeper import get_keeper
from leases.recovery import OrphanReach, log_takeover, prune_workers, resume_one, sweep
from leases.store import Reservation, store_for

SCHEDULE_NAME = "loom.recovery_sweep"
# Options of the backstop schedule's tasks: no success rows (it runs every minute on every cluster
# and would push real tasks out of django-q2's success list), no django-q2 timeout (the resumes
# it runs are bounded by their leases).
BACKSTOP_OPTIONS = {"save": False, "timeout": -1}
# Reservations one sharded pruning looks at (each is one header read on its execution's shard).
RESERVATIONS_PRUNED = 1000

log = logging.getLogger("loom.worker")


class WorkerDraining(RuntimeError):
    """This worker process is shutting down gracefully: a queued start (or backstop sweep) delivered now is not
    begun here; django-q2 does not acknowledge it, so the broker delivers it again, to another worker."""


def run_start(flow: str, input: Any, execution_id: str | None = None, meta: dict | None = None) -> dict:
    """Start a durable execution in this worker process (the body of a queued execution).

    A delivery that finds the execution already there (an earlier delivery began it, or it was
    started by other means) does nothing and reports its status: if that run's worker died, the
    recovery sweep finishes it."""
    from journal.flows import ExecutionExists, OwnershipLost, start
    from journal.flows.runtime import unseal_started
    from journal.privacy.codec import Sealed
    from leases.keeper import draining

    if draining():
        raise WorkerDraining(f"not begun: this worker is shutting down; {execution_id} is delivered again")

    # A flow with marked input is queued sealed (reserve_and_enqueue): the reservation's hash is of the input.
    # Sealed with the subject's key on the execution's shard (data keys live per shard): read there.
    plain = input
    if isinstance(input, Sealed) and isinstance(execution_id, str) and execution_id and "\x00" not in execution_id:
        with shards.on_stream(execution_id):
            plain = unseal_started(input)
    elif isinstance(input, Sealed):
        plain = unseal_started(input)
    if plain is not input and _forgotten(flow, plain):
        release_reservation(execution_id)  # the start will never run: its id is free again
        log.warning("refused execution=%s flow=%s: its input's data subject was forgotten", execution_id, flow)
        return {"execution_id": execution_id, "status": "refused", "duplicate": False,
                "error": "the data subject of the input was forgotten before the start ran; nothing was started"}
    refused = _foreign_start(flow, plain, execution_id, meta)
    if refused is not None:
        log.warning("refused execution=%s flow=%s: %s", execution_id, flow, refused)
        return {"execution_id": execution_id, "status": "refused", "duplicate": True, "error": refused}
    began = time.monotonic()
    # A fresh start bootstraps at fence token 1 (journal/flows/runtime.py).
    log.info("start execution=%s flow=%s fence=1 (queued)", execution_id, flow)
    try:
        outcome = start(flow, input, execution_id=execution_id, meta=meta)
    except ExecutionExists as exists:
        log.info("duplicate execution=%s flow=%s: already %s, nothing to do", exists.execution_id, flow,
                 exists.status)
        release_reservation(execution_id)
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
    release_reservation(outcome.execution_id)
    if outcome.status == "failed":
        log.warning("failed execution=%s flow=%s fence=1 duration=%.3fs error=%s", outcome.execution_id, flow,
                    duration, outcome.error)
    else:
        log.info("%s execution=%s flow=%s fence=1 duration=%.3fs", outcome.status, outcome.execution_id, flow,
                 duration)
    return {"execution_id": outcome.execution_id, "status": outcome.status}


def _forgotten(flow: str, plain: Any) -> bool:
    """Whether a marked field of a queued start's input reads as FORGOTTEN (its subject was forgotten while the
    start was queued)."""
    from journal.flows import events as ev
    from journal.privacy import FORGOTTEN, marking

    payload = {"flow": flow, "input": plain}
    return any(marking.get(payload, f.path) == FORGOTTEN for f in marking.fields_for(ev.EXECUTION_STARTED, payload)
               if f.subject is not None)


def enqueue_start(flow: str, input: Any, execution_id: str | None = None, meta: dict | None = None) -> str:
    """Queue a start for the worker cluster; returns the execution id (minted here when not given).

    The flow, the input and the id are checked now (UnknownFlow, InvalidInput), so a bad start is
    refused to the caller instead of failing later in a worker. The id is reserved with the task
    (reserve_and_enqueue): a repeat of the same start queues nothing more; the id already reserved
    by a start with another flow, input or starter is ExecutionExists."""
    from journal.flows import ExecutionExists
    from journal.flows.runtime import prepare_start

    definition, _, stored, execution_id = prepare_start(flow, input, execution_id)
    existing = reserve_and_enqueue(definition.name, stored, execution_id, meta)
    if existing is not None and not existing.begun and not existing.same_request:
        raise ExecutionExists(execution_id, "queued", existing.flow)
    return execution_id  # a repeat of a queued or begun start queues nothing more


@dataclass(frozen=True, slots=True)
class Reserved:
    """The reservation (or execution) an enqueue found instead of making its own (nothing was queued)."""

    flow: str
    started_by: str
    same_request: bool  # same flow, input and starter: a repeat of the start that reserved the id
    begun: bool = False  # the execution exists (its header): ask it, not the reservation


HASH_SALT = "loom.leases.reservation.input"


def input_hash(stored: Any, secret: str | bytes | None = None) -> str:
    """HMAC-SHA256 of the stored input as canonical JSON, keyed by SECRET_KEY (or `secret`): what a repeat of
    a start must match. Keyed, not a bare SHA-256: the input may hold personal data (an e-mail address is
    found from its bare hash by trying candidates), and a reservation row outlives nothing it should not."""
    text = json.dumps(stored, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=repr)
    return salted_hmac(HASH_SALT, text.encode("utf-8", "surrogatepass"), secret=secret,
                       algorithm="sha256").hexdigest()


def input_hashes(stored: Any) -> list[str]:
    """The input's hash under SECRET_KEY and under each of SECRET_KEY_FALLBACKS: a start reserved before a
    key rotation is still recognised when it is repeated (or delivered) after it."""
    keys = [settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", [])]
    text = json.dumps(stored, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=repr)
    # A reservation written before the hash was keyed (leases 0007) holds the bare SHA-256: matched, never
    # written, so a start queued across the upgrade still begins when its task is delivered.
    legacy = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return [*(input_hash(stored, key) for key in keys), legacy]


def _starter(meta: dict | None) -> str:
    value = (meta or {}).get("started_by") if isinstance(meta, dict) else None
    return value if isinstance(value, str) else ""


def reserve_and_enqueue(flow: str, stored: Any, execution_id: str, meta: dict | None = None) -> Reserved | None:
    """Reserve `execution_id` and queue its start in one transaction; None when queued, else the
    reservation (or execution) that already holds the id, and nothing is queued.

    The reservation row and django-q2's ORM-queue row commit together (same database alias), so a
    start is never queued without its reservation nor reserved without its task. The reservation is
    the leases store's one insert-or-nothing (RESERVE_START): two concurrent starts of one id cannot
    both be queued."""
    from django_q.conf import Conf
    from django_q.tasks import async_task

    from journal.flows.runtime import seal_started
    from journal.flows.writer import header_status

    alias = _alias()
    digest, starter = input_hash(stored), _starter(meta)
    # Marked input fields are sealed before the input reaches the broker: django-q2 keeps its tasks' args
    # (pickled and signed, not encrypted) in its queue and task rows, where `forget` cannot reach them.
    with shards.on_stream(execution_id):  # sealed with the subject's key on the execution's shard
        sealed = seal_started(flow, stored)
    task = ("leases.tasks.run_start", flow, sealed, execution_id, meta)
    options = {"task_name": f"start {flow} {execution_id}"[:100], "q_options": {"timeout": -1}}
    with atomic(alias):
        reserved, holder = store_for(alias).reserve_start(execution_id, flow, digest, starter)
        if not reserved:
            if holder is None:  # the reservation that won was released: its execution began
                return Reserved(flow, "", False, begun=True)
            return Reserved(holder.flow, holder.started_by, holder.matches(flow, input_hashes(stored), starter))
        # A worker deletes a reservation only after the execution's header committed: an insert
        # that won a free id re-reads the header so that it does not reserve a begun execution.
        if header_status(execution_id) is not None:
            transaction.set_rollback(True, using=alias)
            return Reserved(flow, "", False, begun=True)
        if not Conf.SYNC:
            async_task(*task, **options)
    if Conf.SYNC:  # django-q2's sync mode runs the task inside async_task: after the reservation committed
        async_task(*task, **options)
    return None


def _foreign_start(flow: str, stored: Any, execution_id: str | None, meta: dict | None) -> str | None:
    """Why this delivered start is not the one its id was reserved for, or None (run it).

    A task queued before reservations existed, or whose execution already began (the reservation
    is gone), has none: it runs, and start() finds an existing execution (ExecutionExists)."""
    if execution_id is None:
        return None
    row = reservation(execution_id)
    if row is None:
        return None
    if not row.matches(flow, input_hashes(stored), _starter(meta)):
        return (f"the id is reserved by another start (flow {row.flow}, started by {row.started_by or 'code'}); "
                "this delivery is not that start and does nothing")
    return None


def _alias() -> str:
    """The database of the reservations (the router's choice for leases.StartReservation)."""
    from leases.models import StartReservation

    return router.db_for_write(StartReservation)


def reservation(execution_id: str) -> Reservation | None:
    """The reservation of a queued start that has not begun (flow, started_by, created_at), or None."""
    return store_for(_alias()).reservation(execution_id)


def release_reservation(execution_id: str | None) -> None:
    """Delete the reservation of an execution that now exists (its header holds the id from now on)."""
    if execution_id is not None:
        store_for(_alias()).release_reservation(execution_id)


def prune_reservations() -> int:
    """Delete the reservations whose execution exists (a worker died between the execution's first
    write and its release_reservation); the number deleted. Run by the minute backstop."""
    if not shards.sharded():
        return store_for(_alias()).prune_reservations()  # one statement: the join with the headers
    # Sharded: the reservations stay with django-q2's queue (one database), the executions on their shards;
    # no statement can join two databases, so each reservation's header is looked up on its execution's
    # shard (they are few: a reservation lives from the enqueue until its run began).
    from journal.flows.writer import header_status

    store = store_for(_alias())
    return sum(store.release_reservation(eid) for eid in store.reserved_ids(RESERVATIONS_PRUNED)
               if header_status(eid) is not None)


# This process's memory of its backstop sweeps (a django-q2 worker process runs the task every minute or
# so): a full orphan pass in its first and every LOOM_RECOVERY_FULL_EVERY seconds, windows in between.
BACKSTOP_REACH = OrphanReach()


def recovery_sweep() -> int:
    """One takeover sweep per shard and the resumes, and a tick of the due cron schedules, in this
    process (django-q2 schedule: every minute)."""
    from leases.keeper import draining

    if draining():
        return 0  # shutting down: the other workers sweep
    count = 0
    for alias in shards.shards():
        taken = sweep(get_keeper(alias).worker_id, alias=alias, reach=BACKSTOP_REACH)
        log_takeover(taken)
        for execution_id, token in taken.taken:
            resume_one(execution_id, taken.flow_of.get(execution_id, "?"), token)
        prune_workers(alias)
        count += len(taken.taken)
    prune_reservations()
    from leases.schedules import tick

    tick()  # cron schedules too, minute-grained, for a deployment that runs only qcluster (docs/schedules.md)
    wake_backstop()
    return count


WAKE_BACKSTOP_LIMIT = 1000  # executions one backstop run wakes at most (the next minute takes the rest)


def wake_backstop() -> int:
    """Wake the parked executions that are due, here (the minute backstop of the waker service, for
    deployments that run only qcluster: timers fire within a minute there, not milliseconds)."""
    from journal.flows.waits import wake_due

    woken = 0
    while woken < WAKE_BACKSTOP_LIMIT:
        outcomes = wake_due()
        if not outcomes:
            break
        woken += len(outcomes)
    if woken:
        log.info("wake backstop: %d due execution(s) woken", woken)
    return woken


def ensure_schedule() -> None:
    """Create (once) the every-minute django-q2 schedule of `recovery_sweep`, saving no successes."""
    from django_q.models import Schedule

    Schedule.objects.update_or_create(
        name=SCHEDULE_NAME,
        defaults={"func": "leases.tasks.recovery_sweep", "schedule_type": Schedule.MINUTES, "minutes": 1,
                  "repeats": -1, "kwargs": f"q_options={BACKSTOP_OPTIONS!r}"},
    )
