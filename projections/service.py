"""Running drains: `drain()` in the caller's thread, or `DrainService` in a background worker.

DrainService (a leases.worker Service) runs, per worker process:
- one thread per lane (a DrainController), woken by notifications, polling at the lane's cycle_ms
  (or LOOM_DRAIN_POLL_MS), looping at once while it finds work;
- one correlator thread (scan from the checkpoint; at most one worker scans at a time);
- on PostgreSQL with LOOM_DRAIN_LISTEN, one listener thread (LISTEN on LOOM_NOTIFY_CHANNEL).
Several workers on one database share the work through the claims; nothing is coordinated in
memory. Stopping releases the leases of cycles in progress.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from django.db import DatabaseError, connections

from journal import conf, shards
from journal.identity import node_identity
from journal.listen import polls_without_direct
from projections.correlate import correlate
from projections.declarations import Registry, registry
from projections.drain import CycleResult, DrainController
from projections.listener import Listener
from projections.store import store_for

log = logging.getLogger("loom.projections")


def default_worker_id() -> str:
    """This process's claims' holder: the journal's node identity (LOOM_WORKER_ID, or host:pid)."""
    return node_identity()


def sync_declarations(reg: Registry = registry, alias: str | None = None) -> None:
    """Move existing subscriptions to their consumer's declared lane and priority."""
    store = store_for(alias)
    for c in reg.consumers.values():
        store.sync_consumer(c.name, c.lane, c.priority)


def drain(lane: str | None = None, *, worker_id: str | None = None, reg: Registry = registry,
          alias: str | None = None, scan: bool = True, max_cycles: int = 1000) -> CycleResult:
    """Drain until no lane finds work: correlate once, then claim/handle/ack cycles; on one shard, or on
    every shard in turn when none is named.

    For tests, benchmarks and `manage.py drain`; workers use DrainService.
    """
    total = CycleResult()
    if alias is None and shards.sharded():
        for each in shards.shards():
            total.add(drain(lane, worker_id=worker_id, reg=reg, alias=each, scan=scan, max_cycles=max_cycles))
        return total
    alias = alias or shards.home()
    if scan:
        correlate(reg, alias)
    worker = worker_id or default_worker_id()
    lanes = [reg.lanes[lane]] if lane is not None else list(reg.lanes.values())
    controllers = [DrainController(reg, item, worker, alias) for item in lanes]
    for _ in range(max_cycles):
        found = 0
        for controller in controllers:
            result = controller.cycle()
            total.add(result)
            found += result.claimed
        if not found:
            break
    return total


@dataclass
class LaneThread:
    controller: DrainController
    wake: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    cycles: int = 0
    result: CycleResult = field(default_factory=CycleResult)


class DrainService:
    """The drains of every lane (or of `lanes`) as background threads of a worker."""

    name = "projections-drain"

    def __init__(self, reg: Registry = registry, alias: str | None = None, lanes: list[str] | None = None):
        self.registry = reg
        # No alias and several shards: one drain service per shard under this one (`parts`), each with its
        # own lanes, correlation and listener, all feeding the same handlers (one read model).
        self.parts: list[DrainService] = []
        if alias is None and shards.sharded():
            self.parts = [DrainService(reg, each, lanes) for each in shards.shards()]
        self.alias = alias or shards.home()
        self.only = lanes
        self.stopping = threading.Event()
        self.lanes: dict[str, LaneThread] = {}
        self.correlate_wake = threading.Event()
        self.threads: list[threading.Thread] = []
        self.listener: Listener | None = None
        self.worker_id = ""
        self.synced = False
        self.sync_failed = False

    # -- Service protocol -------------------------------------------------------------------------
    def start(self, worker=None) -> None:
        self.worker_id = getattr(worker, "worker_id", None) or default_worker_id()
        if self.parts:
            for part in self.parts:
                part.start(worker)
            return
        if not self.registry.consumers:
            log.info("projections: no reactions or projections declared; drain service idle")
            return
        self.synced = self._sync()
        for lane in self.registry.lanes.values():
            if self.only is not None and lane.name not in self.only:
                continue
            if not self.registry.in_lane(lane.name):
                continue
            item = LaneThread(DrainController(self.registry, lane, self.worker_id, self.alias))
            item.thread = threading.Thread(target=self._lane_loop, args=(item,), daemon=True,
                                           name=f"loom-drain-{lane.name}")
            self.lanes[lane.name] = item
        self._spawn(self._correlate_loop, "loom-correlate")
        listen = store_for(self.alias).notifications and conf.get("LOOM_DRAIN_LISTEN")
        if listen and polls_without_direct(self.alias, "projections' drains", "LOOM_DRAIN_POLL_MS"):
            listen = False
        if listen:
            self.listener = Listener(self.registry, self.alias, self.wake_lanes, self.correlate_wake.set,
                                     self.stopping)
            self._spawn(self.listener.run, "loom-drain-listen")
        for item in self.lanes.values():
            item.thread.start()
            self.threads.append(item.thread)

    def _sync(self) -> bool:
        """Declared lanes and priorities onto the shard's subscriptions; a shard that is down does not stop
        the worker (the correlator retries until it succeeds)."""
        try:
            sync_declarations(self.registry, self.alias)
            return True
        except DatabaseError as exc:
            # Once per outage at WARNING; the correlator's retries (every poll) at DEBUG.
            log.log(logging.DEBUG if self.sync_failed else logging.WARNING,
                    "projections: cannot sync the declarations on %s yet (%s); retrying", self.alias,
                    str(exc).strip().splitlines()[0])
            self.sync_failed = True
            return False
        finally:
            connections[self.alias].close()

    def stop(self, timeout: float = 10.0) -> None:
        for part in self.parts:
            part.stop(timeout)
        self.stopping.set()
        self.correlate_wake.set()
        for item in self.lanes.values():
            item.wake.set()
        for thread in self.threads:
            thread.join(timeout)
        self.threads.clear()

    # -- wake-ups ---------------------------------------------------------------------------------
    def wake_lanes(self, names: set[str] | None = None) -> None:
        for part in self.parts:
            part.wake_lanes(names)
        for name, item in self.lanes.items():
            if names is None or name in names:
                item.wake.set()

    # -- loops ------------------------------------------------------------------------------------
    def _spawn(self, target, name: str) -> None:
        thread = threading.Thread(target=target, daemon=True, name=name)
        thread.start()
        self.threads.append(thread)

    def _interval(self, item: LaneThread) -> float:
        return (item.controller.lane.cycle_ms or conf.get("LOOM_DRAIN_POLL_MS")) / 1000

    def _lane_loop(self, item: LaneThread) -> None:
        try:
            while not self.stopping.is_set():
                item.wake.clear()
                try:
                    result = item.controller.cycle()
                except Exception:
                    log.exception("projections: drain cycle of lane %s failed", item.controller.lane.name)
                    connections[self.alias].close()
                    result = CycleResult()
                item.cycles += 1
                item.result.add(result)
                if result.claimed:
                    continue  # there may be more: claim again at once (watermark-aware, cheap)
                item.wake.wait(self._interval(item))
        finally:
            try:
                item.controller.release()
            except Exception:
                log.exception("projections: releasing leases of lane %s failed", item.controller.lane.name)
            connections.close_all()

    def _correlate_loop(self) -> None:
        poll = conf.get("LOOM_DRAIN_POLL_MS") / 1000
        try:
            while not self.stopping.is_set():
                self.correlate_wake.clear()
                if not self.synced:
                    self.synced = self._sync()
                try:
                    if correlate(self.registry, self.alias):
                        self.wake_lanes()
                except Exception:
                    log.exception("projections: correlation failed")
                    connections[self.alias].close()
                self.correlate_wake.wait(poll)
        finally:
            connections.close_all()

    @property
    def handled(self) -> int:
        return (sum(item.result.handled for item in self.lanes.values())
                + sum(part.handled for part in self.parts))
