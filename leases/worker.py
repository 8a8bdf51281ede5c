"""A Loom worker node: long-running in-process services (lease heartbeat, recovery sweep,
projection drains...) started and stopped together.

Other apps plug in with `register_service(factory)` from their AppConfig.ready(); `Worker.start()`
instantiates every registered factory and starts it. A service starts its own threads and returns
quickly; `stop(timeout)` stops them and releases what it holds. `manage.py loom_worker` runs a
Worker next to django-q2's cluster (see docs/workers.md for why the split).
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from django.db import DatabaseError, connections

from journal import conf, shards
from leases.keeper import (
    LeaseKeeper,
    begin_drain,
    end_drain,
    get_keeper,
    install_keeper,
    keepers,
    mark_child,
    node_identity,
    set_main,
)
from leases.watchdog import StepWatchdog

log = logging.getLogger("loom.worker")


@runtime_checkable
class Service(Protocol):
    name: str

    def start(self, worker: Worker) -> None:
        """Start the service's own threads and return quickly; worker.worker_id is the node id."""
        ...

    def stop(self, timeout: float) -> None:
        """Stop the threads and release what the service holds."""
        ...


# A service may also have, for a graceful shutdown (Worker.stop with a grace, docs/workers.md "Signals"):
#   quiesce() -> None              take no new work from now on (return at once);
#   wait_idle(deadline) -> bool    wait until the runs it started ended, or the monotonic `deadline`.


_factories: list[Callable[[], Service]] = []


def register_service(factory: Callable[[], Service]) -> None:
    """Register a service for every Worker of this process (call from an AppConfig.ready())."""
    if factory not in _factories:
        _factories.append(factory)


def registered_services() -> list[Callable[[], Service]]:
    return list(_factories)


def wait_until(done: Callable[[], bool], deadline: float, every: float = 0.05) -> bool:
    """Poll `done` until it is true or the monotonic `deadline` passed (a service's wait_idle); its last answer."""
    while not done():
        left = deadline - time.monotonic()
        if left <= 0:
            return done()
        time.sleep(min(every, left))
    return True


class Worker:
    """One node: its id, its services, and a clean stop (services in reverse order)."""

    def __init__(self, worker_id: str | None = None, services: list[Callable[[], Service]] | None = None):
        self.worker_id = worker_id or node_identity()
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.factories = registered_services() if services is None else list(services)
        self.services: list[Service] = []
        self.stopped = threading.Event()
        self.retiring: str | None = None  # why the worker retires (its step watchdog abandoned a step), or None

    def start(self) -> None:
        for factory in self.factories:
            service = factory()
            service.start(self)
            self.services.append(service)
            log.info("worker %s: started %s", self.worker_id, service.name)

    def stop(self, timeout: float = 10.0, grace: float = 0.0) -> None:
        """Stop the services in reverse order. `grace` > 0 (SIGTERM to loom_worker: LOOM_SHUTDOWN_GRACE) drains
        first: every service stops taking new work, the runs in flight stop at their next step boundary with
        the step they were in recorded, each handing its lease back as it stops, and the services wait for
        them until the grace is over; then the services stop as without one (what still runs loses its claim
        and its lease is handed back expired)."""
        if grace > 0:
            self.drain(grace)
        try:
            self._stop_services(timeout)
        finally:
            end_drain()

    def drain(self, grace: float) -> bool:
        """Stop taking new work and let the runs in flight reach a step boundary, for at most `grace` seconds;
        True if every service's runs ended within it."""
        deadline = time.monotonic() + grace
        begin_drain()
        log.info("worker %s: shutting down, waiting up to %.1f s (LOOM_SHUTDOWN_GRACE) for running steps",
                 self.worker_id, grace)
        for service in reversed(self.services):
            quiesce = getattr(service, "quiesce", None)
            if quiesce is not None:
                try:
                    quiesce()
                except Exception:
                    log.exception("worker %s: quiescing %s failed", self.worker_id, service.name)
        idle = True
        for service in reversed(self.services):
            wait_idle = getattr(service, "wait_idle", None)
            if wait_idle is not None:
                try:
                    idle = wait_idle(deadline) and idle
                except Exception:
                    log.exception("worker %s: waiting for %s failed", self.worker_id, service.name)
                    idle = False
        if not idle:
            log.warning("worker %s: steps still running after the grace of %.1f s; they are interrupted and "
                        "recovered elsewhere", self.worker_id, grace)
        return idle

    def _stop_services(self, timeout: float) -> None:
        for service in reversed(self.services):
            try:
                service.stop(timeout)
            except Exception:
                log.exception("worker %s: stopping %s failed", self.worker_id, service.name)
        self.services.clear()
        self.stopped.set()

    def retire(self, reason: str) -> None:
        """Stop as on SIGTERM because a step ignored being told to stop (leases/watchdog.py); loom_worker then
        replaces the process. The abandoned step's thread is not waited for."""
        self.retiring = reason
        self.stopped.set()

    def request_stop(self, *_args) -> None:
        """Signal handler: the main thread leaves `wait()` and stops the services."""
        self.stopped.set()

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        # A process inherits its parent thread's signal mask (through fork and exec): a worker started by a thread
        # that blocks SIGTERM (an event loop's) would never hear it.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})

    def wait(self) -> None:
        """Block until request_stop() (a signal) or stop()."""
        while not self.stopped.wait(0.5):
            pass


class HeartbeatService:
    """The process's lease keeper as a worker service: registers the node, renews its leases,
    and on stop hands every lease back (expired, so that other workers recover the runs at once)."""

    name = "lease-heartbeat"

    def start(self, worker: Worker) -> None:
        """One keeper per shard (journal/shards.py), all under the worker's id: each registers the node on its
        shard's workers table and renews the leases of that shard's runs. A shard that is down does not stop
        the worker: its keeper writes the row at its first tick that reaches the shard."""

        set_main(worker.worker_id)
        self.keepers = []
        for alias in shards.shards():
            keeper = get_keeper(alias)
            if keeper.worker_id != worker.worker_id:
                keeper = LeaseKeeper(worker.worker_id, alias)
                install_keeper(keeper)
            keeper.row_wanted = True
            try:
                keeper.register()
            except DatabaseError as exc:
                log.warning("lease keeper %s on %s: cannot register yet (%s); retrying at each tick",
                            keeper.worker_id, alias, str(exc).strip().splitlines()[0])
                connections[alias].close()
            keeper.ensure_started()
            self.keepers.append(keeper)
        self.keeper = self.keepers[0]

    def stop(self, timeout: float) -> None:
        for keeper in self.keepers:  # each shard's keeper stops even when another shard is down
            try:
                released = keeper.shutdown(timeout)
            except DatabaseError:
                log.exception("lease keeper %s on %s: could not hand its leases back (they expire after "
                              "LOOM_LEASE_TTL)", keeper.worker_id, keeper.alias)
                continue
            log.info("lease keeper %s on %s: stopped, %d lease(s) handed back", keeper.worker_id, keeper.alias,
                     released)


class _SharedFlag:
    """A flag in shared memory that forked processes read by polling (DRAIN_POLL s).

    Not multiprocessing.Event: its set() waits until every process sleeping in wait() has woken, and a child
    killed while it waited never does. SIGTERM to the whole process group (systemd's default
    KillMode=control-group, `kill -- -PGID`) kills django-q2's children at once, and loom_worker's main process
    then hung in set() for ever. A RawValue has no lock: set() cannot wait for anyone."""

    def __init__(self) -> None:
        import multiprocessing

        self._value = multiprocessing.get_context("fork").RawValue("b", 0)

    def set(self) -> None:
        self._value.value = 1

    def is_set(self) -> bool:
        return bool(self._value.value)

    def wait(self) -> None:
        while not self._value.value:
            time.sleep(DRAIN_POLL)


DRAIN_POLL = 0.2  # s: how late a child may learn of a graceful shutdown (its grace is seconds)

# Shared with django-q2's processes (created before the cluster forks): set when loom_worker begins a graceful
# shutdown, so that each child drains by the same rule as the main process (_watch_drain).
_children_drain: _SharedFlag | None = None


def share_drain_with_children() -> None:
    """In loom_worker, before its cluster forks: the flag by which its children learn of a graceful shutdown."""
    global _children_drain
    _children_drain = _SharedFlag()


def set_cluster_event(event, timeout: float = 5.0) -> bool:
    """A django-q2 multiprocessing.Event set from a thread of its own, waited for at most `timeout` s.

    set() waits until every process sleeping in the event's wait() has woken (see _SharedFlag); django-q2's
    sentinel sleeps in its stop_event, and one killed by a SIGTERM to the whole process group never wakes. False:
    set() did not return (the event's lock stays taken; the caller must not touch the cluster again)."""
    setter = threading.Thread(target=event.set, name="loom-cluster-stop", daemon=True)
    setter.start()
    setter.join(timeout)
    return not setter.is_alive()


def drain_children() -> None:
    """Tell every django-q2 process of this worker to drain (they were forked after share_drain_with_children)."""
    if _children_drain is not None:
        _children_drain.set()


def register_q_child(**_kwargs) -> None:
    """django-q2's post_spawn signal, in each of its worker processes: give the process its row on
    the workers page (role "django-q2 child", id <main id>/<pid> under loom_worker) and a running
    keeper, whose tick keeps the row's heartbeat fresh while the process lives."""
    mark_child()
    for alias in shards.shards():  # a child runs executions of every shard: a keeper (and a row) on each
        keeper = get_keeper(alias)
        try:
            keeper.register()
        except Exception:  # the row is for the page; the child must run its tasks regardless
            log.exception("worker %s: could not register on %s", keeper.worker_id, alias)
        keeper.ensure_started()
        # A clean exit of the child (django-q2 recycles it, or the cluster stops) marks its row stopped
        # and hands its leases back; multiprocessing runs atexit functions in its forked children.
        atexit.register(_q_child_exit, keeper)
    # The child's own step watchdog: a step that ignores being told to stop retires the child (django-q2's
    # sentinel starts another in its place).

    StepWatchdog(retire=_retire_child).start(None)
    # A graceful shutdown reaches the child from its loom_worker (the shared event). Not its own SIGTERM: django-q2
    # terminates a child whose task outlived Q_CLUSTER["timeout"] with it, and that must stay a kill.
    if _children_drain is not None:
        threading.Thread(target=_watch_drain, name="loom-child-drain", daemon=True).start()
    log.info("worker %s: django-q2 child ready (pid %d)", keeper.worker_id, os.getpid())


def _watch_drain() -> None:
    """In a django-q2 child: once told to drain, its run stops at the next step boundary and hands its lease back
    (a queued start not begun yet is refused: leases.tasks.WorkerDraining, delivered again elsewhere); a step
    still running after LOOM_SHUTDOWN_GRACE is interrupted: the child hands its leases back and exits."""

    _children_drain.wait()
    grace = conf.get("LOOM_SHUTDOWN_GRACE")
    begin_drain()
    running = lambda: any(k.holding() or k.pending or k.acquire_q for k in keepers())  # noqa: E731
    if wait_until(lambda: not running(), time.monotonic() + grace):
        return  # idle: the cluster's STOP (or its SIGTERM) ends the process as usual
    log.warning("worker %s: a step still running after the grace of %.1f s; interrupted, its lease handed back",
                node_identity(), grace)
    for keeper in keepers():
        _q_child_exit(keeper)
    os._exit(0)


def _retire_child(reason: str) -> None:
    """In a django-q2 child whose step was abandoned: hand every lease back and exit (the sentinel replaces it)."""

    log.error("worker %s: retiring: %s", node_identity(), reason)
    for keeper in keepers():
        _q_child_exit(keeper)
    os._exit(0)


def _q_child_exit(keeper) -> None:
    try:
        keeper.shutdown(5)
    except Exception:
        log.exception("worker %s: clean exit failed", keeper.worker_id)
