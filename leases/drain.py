"""Drain a worker: it takes no new work, lets what it runs finish, then exits (the operations page, the workers
admin, `loom workers drain ID`).

The request is a row of leases_drain_request naming the worker (durable: it is there whichever process made it,
and a worker started again under the same id after it had drained is not drained again, the row says it
finished). Each loom_worker runs a DrainService that polls its own row every LOOM_DRAIN_POLL seconds. Seen, it
marks the row started, quiesces every service that takes work (queue dispatcher, recovery sweep, schedule tick,
waker: the same quiesce() a graceful shutdown calls), but unlike a SIGTERM it does not tell the runs to stop at
their next step: each run goes on to its end. Once no service has a run in flight and the process holds no lease,
it marks the row finished and stops the worker as a SIGTERM would (with nothing left running, the grace is not
used). A SIGTERM during a drain is an ordinary graceful shutdown (LOOM_SHUTDOWN_GRACE): the runs still going stop
at their next step boundary and hand their leases back.

With the django-q2 cluster (loom_worker without --no-cluster), its children keep taking Django tasks until the
drain's exit, which stops them by the graceful-shutdown rule.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime

from django.db import DatabaseError, connections, router

from journal.ids import stored_id_problem
from journal.store.base import DatabaseBound
from leases import conf
from leases.keeper import keepers
from leases.models import DrainRequest

log = logging.getLogger("loom.worker")

# -- request -- An operator's request; a request for a worker with an unfinished one keeps the first (who asked,
# since when); one that finished is replaced by the new one (the worker was started again and is to drain again).
REQUEST = """
INSERT INTO leases_drain_request (worker_id, requested_at, requested_by, started_at, finished_at)
VALUES (%s, %s, %s, NULL, NULL)
ON CONFLICT (worker_id) DO UPDATE SET requested_at = excluded.requested_at, requested_by = excluded.requested_by,
    started_at = NULL, finished_at = NULL
WHERE leases_drain_request.finished_at IS NOT NULL
"""
# -- pending -- The worker's own poll: its unfinished request, if any (primary key probe, no lock).
PENDING = "SELECT requested_at, requested_by, started_at FROM leases_drain_request WHERE worker_id = %s " \
          "AND finished_at IS NULL"
# -- seen / done -- The worker's own marks (only it writes them).
SEEN = "UPDATE leases_drain_request SET started_at = %s WHERE worker_id = %s AND started_at IS NULL"
DONE = "UPDATE leases_drain_request SET finished_at = %s WHERE worker_id = %s AND finished_at IS NULL"
# -- live worker -- Whether the worker id names a worker row that has not stopped (the request's check).
LIVE_WORKER = "SELECT 1 FROM leases_worker WHERE id = %s AND stopped_at IS NULL"


class UnknownWorker(ValueError):
    """No running worker of that id (no row, or its row says it stopped): nothing was written."""


class DrainStore(DatabaseBound):
    """The SQL of leases_drain_request (portable: the same statements on PostgreSQL and SQLite)."""

    def _now(self):
        from django.utils import timezone

        now = timezone.now()
        if self.connection.vendor == "sqlite":
            from leases.store.sqlite import stamp

            return stamp(now)  # the text form Django's SQLite datetimes have
        return now

    def live(self, worker_id: str) -> bool:
        return bool(self._rows(LIVE_WORKER, [worker_id]))

    def request(self, worker_id: str, by: str) -> bool:
        """True if a new request was written, False if an unfinished one was already there (kept)."""
        return self._count(REQUEST, [worker_id, self._now(), by]) == 1

    def pending(self, worker_id: str) -> tuple | None:
        rows = self._rows(PENDING, [worker_id])
        return rows[0] if rows else None

    def seen(self, worker_id: str) -> None:
        self._count(SEEN, [self._now(), worker_id])

    def done(self, worker_id: str) -> None:
        self._count(DONE, [self._now(), worker_id])


def _alias() -> str:
    return router.db_for_write(DrainRequest)


@dataclass(frozen=True, slots=True)
class Requested:
    worker_id: str
    new: bool  # False: an unfinished request was already there


def request(worker_id: str, by: str = "", using: str | None = None) -> Requested:
    """Ask the worker to drain; UnknownWorker (nothing written) if no running worker has that id. The worker
    carries it out within LOOM_DRAIN_POLL seconds."""
    if stored_id_problem(worker_id) is not None:  # not a str, empty, too long, NUL (PostgreSQL's DataError)
        raise UnknownWorker(f"no running worker {worker_id!r}")
    store = DrainStore(using or _alias())
    if not store.live(worker_id):
        raise UnknownWorker(f"no running worker {worker_id!r} (no worker row, or it stopped)")
    return Requested(worker_id, store.request(worker_id, by[:200]))


def state(worker_ids: list[str], using: str | None = None) -> dict[str, tuple[datetime, str, datetime | None,
                                                                              datetime | None]]:
    """worker id -> (requested_at, requested_by, started_at, finished_at) of its drain request (the admin)."""

    rows = DrainRequest.objects.using(using or router.db_for_read(DrainRequest)).filter(worker_id__in=worker_ids)
    return {r.worker_id: (r.requested_at, r.requested_by, r.started_at, r.finished_at) for r in rows}


class DrainService:
    """The worker service that carries out a drain request naming this worker (leases.worker.register_service)."""

    name = "drain-watch"

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None
        self.draining = False

    def start(self, worker) -> None:
        self.worker = worker
        self.store = DrainStore(_alias())
        self.thread = threading.Thread(target=self._loop, name="loom-drain-watch", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        try:
            while not self.stopping.wait(conf.get("LOOM_DRAIN_POLL")):
                try:
                    found = self.store.pending(self.worker.worker_id)
                except DatabaseError:
                    log.exception("worker %s: reading its drain request failed; retrying", self.worker.worker_id)
                    connections[self.store.alias].close()
                    continue
                if found is not None:
                    self._drain(found[1])
                    return
        finally:
            connections[self.store.alias].close()

    def _drain(self, by: str) -> None:
        wid = self.worker.worker_id
        self.draining = True
        try:  # only the note that the drain started: the drain is carried out whether or not it is written
            self.store.seen(wid)
        except DatabaseError:
            log.exception("worker %s: marking its drain started failed (it drains regardless)", wid)
            connections[self.store.alias].close()
        log.info("worker %s: draining (asked by %s): taking no new work, letting the running executions finish",
                 wid, by or "an operator")
        for service in self.worker.services:
            quiesce = getattr(service, "quiesce", None)
            if quiesce is not None and service is not self:
                try:
                    quiesce()
                except Exception:
                    log.exception("worker %s: quiescing %s failed", wid, service.name)
        waiting = [s for s in self.worker.services if getattr(s, "wait_idle", None) and s is not self]
        while not self.stopping.is_set():
            idle = all([service.wait_idle(time.monotonic() + 0.5) for service in waiting])
            if idle and not any(keeper.holding() for keeper in keepers()):
                break
            self.stopping.wait(0.2)
        if self.stopping.is_set():
            return  # stopped meanwhile (SIGTERM): the graceful shutdown hands back what still runs
        try:
            self.store.done(wid)
        except DatabaseError:
            log.exception("worker %s: marking its drain finished failed (it exits regardless)", wid)
        log.info("worker %s: drained (no run left); exiting", wid)
        self.worker.request_stop()

    def stop(self, timeout: float) -> None:
        self.stopping.set()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout)
