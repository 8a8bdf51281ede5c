"""django-q2 tasks of the leases app: the minute-grained backstop, and shims for old-scheme starts.

Loom's starts no longer travel through django-q2's broker: every durable start is a queued execution
on the one leased queue (queues.enqueue: its header, status queued, and its entry in one transaction),
which loom_worker's dispatchers run within the queues' caps (docs/workers.md). What django-q2 still does:
- its cluster (forked by `manage.py loom_worker`, or `qcluster`) hosts the project's own `async_task`s,
  and the every-minute `recovery_sweep` backstop, which also runs due queue entries for a deployment that
  runs only qcluster (no dispatcher there);
- `run_start` and `journal.flows.handover.run_handed_over` stay as the bodies of tasks queued under the old
  scheme before an upgrade: delivered now, each is routed into the queue (a queued execution under the
  id its reservation holds, or a resume entry), so it runs once, under the caps. `enqueue_start` is kept
  for callers of the old name: it is queues.enqueue on the default queue.

A reservation (leases.StartReservation) is what the old scheme wrote beside its task; it is read here
only to refuse a delivered task that is not the reserved start, and pruned by the backstop.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import router
from django.utils.crypto import salted_hmac

import queues
from journal import shards
from journal.flows import ExecutionExists, header_status, unseal_started, wake_due
from journal.flows import events as ev
from journal.privacy import FORGOTTEN, marking
from journal.privacy.codec import Sealed
from leases.keeper import draining, get_keeper
from leases.models import StartReservation
from leases.recovery import OrphanReach, log_takeover, prune_workers, resume_one, sweep
from leases.schedules import tick
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
    """The body of a start queued under the old scheme (a django-q2 task): routed into the one start path,
    a queued execution on the default queue under its reserved id (a loom_worker's dispatcher runs it).

    A delivery that finds the execution already there (an earlier delivery queued it, or it was started by
    other means) does nothing and reports its status; one that is not the start its id was reserved for,
    or whose input's data subject was forgotten meanwhile, is refused."""

    if draining():
        raise WorkerDraining(f"not begun: this worker is shutting down; {execution_id} is delivered again")

    # A flow with marked input was queued sealed (the old reserve_and_enqueue): the reservation's hash is of
    # the input. Sealed with the subject's key on the execution's shard (data keys live per shard): read there.
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
    try:
        queued = queues.enqueue(flow, plain, execution_id=execution_id, meta=meta)
    except ExecutionExists as exists:
        log.info("duplicate execution=%s flow=%s: already %s, nothing to do", exists.execution_id, flow,
                 exists.status)
        release_reservation(execution_id)
        return {"execution_id": exists.execution_id, "status": exists.status, "duplicate": True}
    release_reservation(queued.execution_id)
    if queued.created:
        log.info("old-scheme start execution=%s flow=%s: queued on %s", queued.execution_id, flow, queued.queue)
    else:
        log.info("duplicate execution=%s flow=%s: queued already, nothing to do", queued.execution_id, flow)
    return {"execution_id": queued.execution_id, "status": "queued", "duplicate": not queued.created}


def _forgotten(flow: str, plain: Any) -> bool:
    """Whether a marked field of a queued start's input reads as FORGOTTEN (its subject was forgotten while the
    start was queued)."""

    payload = {"flow": flow, "input": plain}
    return any(marking.get(payload, f.path) == FORGOTTEN for f in marking.fields_for(ev.EXECUTION_STARTED, payload)
               if f.subject is not None)


def enqueue_start(flow: str, input: Any, execution_id: str | None = None, meta: dict | None = None) -> str:
    """The old name of a queued start: queues.enqueue on the default queue; returns the execution id.

    Checked now (UnknownFlow, InvalidInput); a repeat of the same start queues nothing more; the id of
    another start or of an existing execution is ExecutionExists."""

    return queues.enqueue(flow, input, execution_id=execution_id, meta=meta).execution_id


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

    store = store_for(_alias())
    return sum(store.release_reservation(eid) for eid in store.reserved_ids(RESERVATIONS_PRUNED)
               if header_status(eid) is not None)


# This process's memory of its backstop sweeps (a django-q2 worker process runs the task every minute or
# so): a full orphan pass in its first and every LOOM_RECOVERY_FULL_EVERY seconds, windows in between.
BACKSTOP_REACH = OrphanReach()


def recovery_sweep() -> int:
    """One takeover sweep per shard and the resumes, and a tick of the due cron schedules, in this
    process (django-q2 schedule: every minute)."""

    if draining():
        return 0  # shutting down: the other workers sweep
    count = 0
    for alias in shards.shards():
        taken = sweep(get_keeper(alias).worker_id, alias=alias, reach=BACKSTOP_REACH)
        log_takeover(taken)
        for execution_id, token in taken.taken:
            resume_one(execution_id, taken.flow_of.get(execution_id, "?"), token,
                       count=execution_id not in taken.handed_back)
        prune_workers(alias)
        count += len(taken.taken)
    prune_reservations()

    tick()  # cron schedules too, minute-grained, for a deployment that runs only qcluster (docs/schedules.md)
    wake_backstop()
    queue_backstop()
    return count


QUEUE_BACKSTOP_LIMIT = 100  # queued executions one backstop run begins at most (the next minute takes more)


def queue_backstop() -> int:
    """Run due queue entries here, within their queues' caps (the minute backstop of the queue dispatcher,
    for deployments that run only qcluster: a queued start begins within a minute there)."""
    from django.apps import apps

    if not apps.is_installed("queues"):
        return 0

    ran = len(queues.run_due(QUEUE_BACKSTOP_LIMIT))
    if ran:
        log.info("queue backstop: %d queued execution(s) run", ran)
    return ran


WAKE_BACKSTOP_LIMIT = 1000  # executions one backstop run wakes at most (the next minute takes the rest)


def wake_backstop() -> int:
    """Wake the parked executions that are due, here (the minute backstop of the waker service, for
    deployments that run only qcluster: timers fire within a minute there, not milliseconds)."""

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

    defaults = {"func": "leases.tasks.recovery_sweep", "schedule_type": Schedule.MINUTES, "minutes": 1,
                "repeats": -1, "kwargs": f"q_options={BACKSTOP_OPTIONS!r}"}
    try:
        Schedule.objects.update_or_create(name=SCHEDULE_NAME, defaults=defaults)
    except Schedule.MultipleObjectsReturned:
        # Workers started at once (a deploy of several hosts) each found none and created one: django-q2's
        # Schedule.name is not unique. Keep the oldest row, drop the others; a worker never fails its start here.
        rows = Schedule.objects.filter(name=SCHEDULE_NAME).order_by("pk")
        keep = rows.first()
        rows.exclude(pk=keep.pk).delete()
        Schedule.objects.filter(pk=keep.pk).update(**defaults)
