"""The lease keeper: one per process, it holds every lease this process's runs own.

One background thread ("loom-lease-keeper") does all lease I/O, so the number of statements
never grows with the number of runs:
- acquires are group-committed: eager runs queue their request and wait; everything queued
  while the previous statement ran goes out as one `acquire_many` per chunk;
- releases are group-committed the same way, but nobody waits for them (a release lost in a
  crash only means the lease expires);
- every LOOM_LEASE_RENEW_EVERY seconds all held leases are renewed, one `renew_many` per
  LOOM_LEASE_CHUNK leases; a lease missing from the answer was taken over: its claim is lost;
- lazy claims wait in an insertion-ordered dict (their deadlines are in insertion order, since
  the grace is one constant), so a lazy start costs a dict insert and its end a dict pop; the
  thread acquires the ones still running when their grace is over.

A claim also counts as lost once its last successful renewal is older than the TTL (the keeper
may have been paused or cut off from the database): a run must not trust a lease it cannot
prove it still holds. Correctness never depends on this process's memory: the fence refuses a
former owner's appends whatever it believes.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable

from django.db import DatabaseError, connections

from journal import shards, telemetry
from journal.identity import node_identity as journal_node_identity
from leases import conf
from leases.store import store_for

log = logging.getLogger("loom.leases")

PENDING, ACQUIRING, HELD, ENDED = "pending", "acquiring", "held", "ended"
IDLE_CLOSE_SECONDS = 0.5
# Releases are not urgent (the execution is settled; no sweeper looks at it): they ride along with
# the next acquire statement, or go out on their own after this delay.
RELEASE_DELAY = 0.2


class LeaseClaim:
    """One run's hold on one execution (the journal.flows.ownership.Claim protocol)."""

    __slots__ = ("_lost", "deadline", "ended", "execution_id", "graceful", "handed_back", "keeper", "state", "token")

    def __init__(self, keeper: LeaseKeeper, execution_id: str, token: int, state: str):
        self.keeper, self.execution_id, self.token, self.state = keeper, execution_id, token, state
        self._lost = False
        self.ended = False
        self.handed_back = False  # abandoned while draining: its lease is expired at once, not left to lapse
        self.graceful = False  # ... and the run stopped at a step boundary: the hand-back is marked (no recovery)
        self.deadline: float | None = None  # monotonic time the lease is last known to expire

    @property
    def lost(self) -> bool:
        if self._lost:
            return True
        deadline = self.deadline
        return deadline is not None and time.monotonic() > deadline

    @property
    def draining(self) -> bool:
        """The process is shutting down gracefully: the run stops at its next step boundary (its finished step
        recorded) and `abandon()` hands the lease back (journal/flows/runtime.py `yield_if_draining`)."""
        return _draining.is_set()

    @property
    def item(self) -> tuple[str, int]:
        return self.execution_id, self.token

    @property
    def settle_owner(self) -> str | None:
        """The owner whose lease row the settle statement may delete (a held, unlost lease)."""
        return self.keeper.worker_id if self.state == HELD and not self._lost else None

    def end(self, released: bool = False) -> None:
        self.keeper.end(self, released)

    def abandon(self, graceful: bool = False) -> None:
        """The run halted with the execution still running: the lease lapses (journal/flows/ownership.py);
        while the process drains, it is handed back instead (expired now: the next sweep anywhere takes it).
        graceful=True: the run stopped at a step boundary for the shutdown (ShuttingDown), so the row is marked
        handed back and its takeover counts no recovery attempt (LOOM_RECOVERY_MAX_ATTEMPTS catches runs that
        die, not workers that stop)."""
        self.keeper.end(self, unfinished=True, graceful=graceful)

    def hand_back(self) -> None:
        """Give the execution up now while its run still works on it (a step whose heartbeat timed out, a
        retiring worker: leases/watchdog.py): the lease is expired at once for another worker's sweep, and the
        claim is lost, so whatever the run writes later is refused and it stops at its next boundary."""
        self.keeper.end(self, unfinished=True, hand_back=True)  # not graceful: its takeover counts
        self._lost = True

    def __repr__(self) -> str:
        return f"<LeaseClaim {self.execution_id}@{self.token} {self.state}{' lost' if self._lost else ''}>"


# What this process is, for the workers page: "main" (a loom_worker), "django-q2 child" (a process
# its cluster forked: each gets its own worker id and row), or "caller" (a web process or shell
# whose runs take leases). A forked child of a main or of a child is a child.
MAIN, CHILD, CALLER = "main", "django-q2 child", "caller"
_role = CALLER
_main_id: str | None = None


def set_main(worker_id: str) -> None:
    """Mark this process as a loom_worker main named `worker_id` (before its cluster forks)."""
    global _role, _main_id
    _role, _main_id = MAIN, worker_id


def mark_child() -> None:
    """Mark this process as a django-q2 worker process (its post_spawn signal; under a plain
    `qcluster` too, where no loom_worker main forked it)."""
    global _role
    _role = CHILD


# A graceful shutdown of this process is under way (leases/worker.py): runs stop at their next step boundary
# and hand their leases back. Process-wide (every keeper's claims), cleared when the worker has stopped.
_draining = threading.Event()


def begin_drain() -> None:
    """Runs of this process stop taking new steps; each hands its lease back as it stops."""
    _draining.set()


def end_drain() -> None:
    _draining.clear()


def draining() -> bool:
    return _draining.is_set()


def process_role() -> str:
    return _role


def node_identity() -> str:
    """This process's worker id: LOOM_WORKER_ID, or host:pid; a django-q2 child of a loom_worker
    is <main id>/<pid>, so that it has its own row even when LOOM_WORKER_ID names the main."""
    if _role == CHILD and _main_id:
        return f"{_main_id}/{os.getpid()}"
    return journal_node_identity()


def chunks(items: list, size: int) -> Iterable[list]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


class LeaseKeeper:
    def __init__(self, worker_id: str | None = None, alias: str | None = None, autostart: bool = True):
        self.worker_id = worker_id or node_identity()
        self.autostart = autostart  # False: no thread; the caller drives step()/tick() (tests)
        # Leases sent per kind of statement, and statements issued: what this process cost the table.
        # "inline": leases written by the runs' own bootstrap statements (no keeper statement).
        self.stats = {"acquire": 0, "renew": 0, "release": 0, "acquire_statements": 0, "renew_statements": 0,
                      "release_statements": 0, "inline": 0, "handback": 0}
        # The database of these leases: one keeper per shard (journal/shards.py), each with its own thread,
        # since a lease lives on its execution's shard and one statement reaches one database.
        self.alias = alias or shards.home()
        self.cond = threading.Condition()
        self.pending: OrderedDict[LeaseClaim, float] = OrderedDict()
        self.held: dict[LeaseClaim, None] = {}
        self.acquire_q: list[LeaseClaim] = []
        self.release_q: list[tuple[str, int]] = []
        # Leases handed back by runs that stopped for a graceful shutdown: (item, has a row, graceful). Expired at
        # once (a row written expired when the claim had none yet), so another worker's next sweep takes them
        # over; graceful (stopped at a step boundary): marked so, that takeover is no recovery attempt.
        self.handback_q: list[tuple[tuple[str, int], bool, bool]] = []
        self.thread: threading.Thread | None = None
        self.stopping = False
        self.next_renew = 0.0
        self.ticks = 0
        self.busy = False  # a step is running (drain() waits for it)
        self.idle_close_at = float("inf")
        self.registered = False  # the worker row is written before the first lease, not before
        self.row_wanted = False  # a worker service asked for the row: a failed register is retried each tick
        self.batch_done = threading.Event()  # set when the queued acquires have been answered
        self.release_due = float("inf")
        self.force_flush = False
        self.sleeping = False  # the keeper waits on cond (only then does a new request notify it)
        self.unexpected = 0  # passes in a row that failed with an error not the database's (logged sparingly)

    # -- settings, read when used --------------------------------------------------------------
    @staticmethod
    def ttl() -> float:
        return conf.get("LOOM_LEASE_TTL")

    # -- what runs call --------------------------------------------------------------------------
    def begin_eager(self, execution_id: str, token: int, wait: bool = True) -> LeaseClaim:
        """Queue an acquire and wait for its group commit; a refused acquire returns a lost claim."""
        claim = LeaseClaim(self, execution_id, token, ACQUIRING)
        self.ensure_started()
        with self.cond:
            self.acquire_q.append(claim)
            done = self.batch_done  # one event per group commit, shared by everyone in it
            if self.sleeping:  # a busy keeper takes the queue after its statement anyway
                self.cond.notify_all()
        if wait and not done.wait(self.ttl()):
            claim._lost = True  # the keeper could not answer within a TTL: do not run unleased
        return claim

    def begin_inline(self, execution_id: str, token: int, sent_at: float) -> LeaseClaim:
        """The bootstrap statement already wrote this lease (inline, eager mode): no statement and
        no hand-off, just a place in the renewal set; the next tick renews it if the run is still
        going. `sent_at`: monotonic time before the bootstrap was sent (its TTL began after)."""
        claim = LeaseClaim(self, execution_id, token, HELD)
        claim.deadline = sent_at + self.ttl()
        self.ensure_started()
        with self.cond:
            self.held[claim] = None
            self.stats["inline"] += 1
        return claim

    def begin_lazy(self, execution_id: str, token: int) -> LeaseClaim:
        """No lease yet: the keeper acquires one if the run is still going after the grace."""
        claim = LeaseClaim(self, execution_id, token, PENDING)
        due = time.monotonic() + conf.lease_grace()
        self.ensure_started()
        with self.cond:
            self.pending[claim] = due
            if len(self.pending) == 1:
                self.cond.notify_all()  # the keeper may be sleeping until a later renewal
        return claim

    def end(self, claim: LeaseClaim, released: bool = False, unfinished: bool = False,
            hand_back: bool = False, graceful: bool = False) -> None:
        """The run is over; released=True: its settle statement deleted the lease already. unfinished=True:
        the execution is still running (the run halted): its lease is neither renewed nor deleted, so it
        lapses after the TTL and the recovery sweep's expired-lease arm takes the execution over. (Deleting
        it would leave a running execution without a lease whose header is older than the sweeps' orphan
        window: only the rare full pass would find it.)"""
        with self.cond:
            if claim.ended:
                return
            claim.ended = True
            # A graceful shutdown: the execution goes on elsewhere at once, not after the lease lapsed.
            back = unfinished and not claim._lost and (hand_back or _draining.is_set())
            graceful = back and graceful and not hand_back
            if claim.state == PENDING:
                self.pending.pop(claim, None)  # within the grace: no lease was ever written
                if back:
                    self.handback_q.append((claim.item, False, graceful))
            elif claim.state == HELD:
                self.held.pop(claim, None)
                if back:
                    self.handback_q.append((claim.item, True, graceful))
                elif not claim._lost and not released and not unfinished:
                    if not self.release_q:
                        self.release_due = time.monotonic() + RELEASE_DELAY
                        self.cond.notify_all()
                    self.release_q.append(claim.item)
            elif claim.state == ACQUIRING and back:
                claim.handed_back, claim.graceful = True, graceful  # the keeper expires it when the acquire returns
            # ACQUIRING: the keeper releases it when the acquire returns.
            claim.state = ENDED
            if back:
                self.cond.notify_all()

    # -- the thread --------------------------------------------------------------------------------
    def ensure_started(self) -> None:
        if not self.autostart:
            return
        if self.thread is not None and self.thread.is_alive():
            return
        with self.cond:
            if self.thread is not None and self.thread.is_alive():
                return
            self.stopping = False
            self.thread = threading.Thread(target=self._loop, name="loom-lease-keeper", daemon=True)
            self.thread.start()

    def _loop(self) -> None:
        try:
            while True:
                with self.cond:
                    while not self.stopping and not self.acquire_q and not self.handback_q and not self._releases_due():
                        now = time.monotonic()
                        wait = min(self.next_renew, self.release_due) - now
                        if self.pending:
                            wait = min(wait, next(iter(self.pending.values())) - now)
                        if wait <= 0:
                            break
                        if not self.held and not self.pending and not self.release_q:
                            # Idle: give the database connection back after a moment, so a process
                            # whose runs are all short (or a test run) keeps no session open.
                            if now >= self.idle_close_at:
                                connections[self.alias].close()
                                self.idle_close_at = float("inf")
                            wait = min(wait, self.idle_close_at - now)
                        self.sleeping = True
                        self.cond.wait(wait)
                        self.sleeping = False
                    if self.stopping:
                        return
                    self.busy = True
                    self.idle_close_at = time.monotonic() + IDLE_CLOSE_SECONDS
                try:
                    store_for(self.alias).prepare_keeper_session()
                    self.step()
                    self.unexpected = 0
                except DatabaseError:
                    log.exception("lease keeper %s: database error; retrying", self.worker_id)
                    connections[self.alias].close()
                    time.sleep(min(1.0, conf.get("LOOM_LEASE_RENEW_EVERY")))
                except Exception as exc:
                    # Not the database's (a driver's or a host's own error): the keeper must live on, since a
                    # dead keeper renews nothing and every lease it holds would lapse under a healthy run.
                    # The traceback once per streak, then a line at the 2nd, 4th, 8th ... failure: a persistent
                    # error retried every renewal period must not flood the log.
                    self.unexpected += 1
                    if self.unexpected == 1:
                        log.exception("lease keeper %s: unexpected error in a pass; retrying", self.worker_id)
                    elif self.unexpected & (self.unexpected - 1) == 0:
                        log.warning("lease keeper %s: %d passes in a row failed, still retrying: %r", self.worker_id,
                                    self.unexpected, exc)
                    connections[self.alias].close()
                    time.sleep(min(1.0, conf.get("LOOM_LEASE_RENEW_EVERY")))
                finally:
                    with self.cond:
                        self.busy = False
                        self.cond.notify_all()
        finally:
            connections[self.alias].close()

    def register(self) -> None:
        """Write this node's worker row (before its first lease, or when a worker starts)."""
        store_for(self.alias).touch_worker(self.worker_id, socket.gethostname(), os.getpid(), _role)
        self.registered = True

    def _releases_due(self) -> bool:
        q = self.release_q
        return bool(q) and (self.force_flush or time.monotonic() >= self.release_due
                            or len(q) >= conf.get("LOOM_LEASE_CHUNK"))

    def step(self, flush: bool = False) -> None:
        """One pass: group-commit queued acquires (with the queued releases riding along), send
        releases that are due, promote lazy claims past their grace, renew when due. Public so
        tests can drive it without the thread (flush=True: send every queued release now)."""
        now = time.monotonic()
        with self.cond:
            batch, self.acquire_q = self.acquire_q, []
            back, self.handback_q = self.handback_q, []
            done, self.batch_done = self.batch_done, threading.Event()
            releases: list[tuple[str, int]] = []
            if self.release_q and (batch or flush or self.stopping or self._releases_due()):
                releases, self.release_q = self.release_q, []
                self.release_due = float("inf")
            while self.pending:
                claim, due = next(iter(self.pending.items()))
                if due > now:
                    break
                del self.pending[claim]
                claim.state = ACQUIRING
                batch.append(claim)
        try:
            if back:
                try:
                    self.flush_handbacks(back)
                except DatabaseError:
                    log.exception("lease keeper %s: hand-back failed; retrying", self.worker_id)
                    connections[self.alias].close()
                    with self.cond:  # handed back at a later pass (or by shutdown), not dropped
                        self.handback_q[:0] = back
                    if self.autostart:
                        time.sleep(min(1.0, conf.get("LOOM_LEASE_RENEW_EVERY")))  # not a busy loop
            if batch:
                self.flush_acquires(batch, releases)
            elif releases:
                self.flush_releases(releases)
        finally:
            done.set()
        if time.monotonic() >= self.next_renew:
            self.tick()

    def flush_acquires(self, batch: list[LeaseClaim], releases: list[tuple[str, int]] = ()) -> None:
        store = store_for(self.alias)
        ttl = self.ttl()
        # One claim per execution per statement: a superseded one (lower token) is lost at once.
        best: dict[str, LeaseClaim] = {}
        for claim in batch:
            other = best.get(claim.execution_id)
            if other is None or claim.token > other.token:
                if other is not None:
                    other._lost = True
                best[claim.execution_id] = claim
            else:
                claim._lost = True
        wanted = list(best.values())
        if not self.registered:
            self.register()
        size = conf.get("LOOM_LEASE_CHUNK")
        # Releases ride along with the first acquire statement (an execution acquired again in
        # this batch needs no release: its higher token supersedes the row).
        riding = [item for item in dict.fromkeys(releases) if item[0] not in best]
        to_release: list[tuple[str, int]] = riding[size:]
        riding = riding[:size]
        for part in chunks(wanted, size):
            started = time.monotonic()
            self.stats["acquire"] += len(part)
            self.stats["acquire_statements"] += 1
            self.stats["release"] += len(riding)
            try:
                acquired = store.acquire_many(self.worker_id, [c.item for c in part], ttl, release=riding)
            except DatabaseError:
                acquired = set()
                log.exception("lease keeper %s: acquire failed", self.worker_id)
                connections[self.alias].close()
            with self.cond:
                for claim in part:
                    if claim.execution_id in acquired:
                        claim.deadline = started + ttl
                        if claim.handed_back:
                            self.handback_q.append((claim.item, True, claim.graceful))
                        elif claim.ended:
                            to_release.append(claim.item)
                        else:
                            claim.state = HELD
                            self.held[claim] = None
                    else:
                        claim._lost = True
            riding = []
        if to_release:
            self.flush_releases(to_release)

    def flush_handbacks(self, items: list[tuple[tuple[str, int], bool, bool]]) -> None:
        """Hand leases back: a held one expired now, one never written (a lazy claim within its grace) written
        expired (an acquire with a TTL of 0), so that the sweep's expired-lease arm takes each over at once.
        Graceful ones (the run stopped at a step boundary) are marked handed back: their takeover is no recovery
        attempt; the others (a step cut off) count, as after a crash."""
        store = store_for(self.alias)
        size = conf.get("LOOM_LEASE_CHUNK")
        sent: list[tuple[str, int]] = []
        for graceful in (True, False):
            held = list(dict.fromkeys(item for item, has_row, g in items if has_row and g == graceful))
            rowless = list(dict.fromkeys(item for item, has_row, g in items if not has_row and g == graceful))
            for part in chunks(held, size):
                store.expire_many(self.worker_id, part, graceful=graceful)
            if rowless and not self.registered:
                self.register()
            for part in chunks(rowless, size):
                store.acquire_many(self.worker_id, part, 0.0, handed_back=graceful)
            sent += held + rowless
        self.stats["handback"] += len(sent)
        for execution_id, token in sent:
            log.info("lease handed back execution=%s fence=%s owner=%s: shutting down, another worker continues",
                     execution_id, token, self.worker_id)

    def flush_releases(self, items: list[tuple[str, int]]) -> None:
        store = store_for(self.alias)
        for part in chunks(list(dict.fromkeys(items)), conf.get("LOOM_LEASE_CHUNK")):
            self.stats["release"] += len(part)
            self.stats["release_statements"] += 1
            store.release_many(self.worker_id, part)

    def tick(self) -> None:
        """Renew every held lease: one renew_many per chunk, plus the worker row's heartbeat."""
        self.next_renew = time.monotonic() + conf.get("LOOM_LEASE_RENEW_EVERY")
        self.ticks += 1
        store = store_for(self.alias)
        ttl = self.ttl()
        with self.cond:
            held = list(self.held)
        for part in chunks(held, conf.get("LOOM_LEASE_CHUNK")):
            started = time.monotonic()
            self.stats["renew"] += len(part)
            self.stats["renew_statements"] += 1
            renewed = store.renew_many(self.worker_id, [c.item for c in part], ttl)
            telemetry.count("renewals", len(part))  # metrics (a no-op when off)
            with self.cond:
                for claim in part:
                    if claim.execution_id in renewed:
                        claim.deadline = started + ttl
                    elif not claim.ended:
                        claim._lost = True  # taken over: the new owner's fence refuses us anyway
                        self.held.pop(claim, None)
                        log.warning("lease lost execution=%s fence=%s owner=%s: taken over (the run stops at its "
                                    "next step)", claim.execution_id, claim.token, self.worker_id)
        if self.registered:
            store.touch_worker(self.worker_id, socket.gethostname(), os.getpid(), _role)
        elif held or self.row_wanted:  # inline leases without a row, or a register that failed: write it now
            self.register()

    def drain(self, timeout: float = 10.0) -> bool:
        """Wait until every queued acquire and release has been committed (tests, benchmarks)."""
        with self.cond:
            self.force_flush = True
            self.cond.notify_all()
            try:
                return self.cond.wait_for(lambda: not (self.acquire_q or self.release_q or self.busy), timeout)
            finally:
                self.force_flush = False

    # -- shutdown ------------------------------------------------------------------------------------
    def holding(self) -> list[LeaseClaim]:
        with self.cond:
            return list(self.held)

    def shutdown(self, timeout: float = 5.0) -> int:
        """Stop the thread; every run still going loses its claim (stops at its next step), and its
        lease is expired at once so another worker's sweep takes it over without waiting a TTL.
        Returns the number of leases handed back."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
            thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        with self.cond:
            claims = list(self.held) + list(self.pending) + self.acquire_q
            releases, self.release_q = self.release_q, []
            back, self.handback_q = self.handback_q, []
            for claim in claims:
                claim._lost = True
            self.batch_done.set()
            held = [c.item for c in self.held]
            # Lazy claims within their grace have no row: written expired, so they are not orphans for
            # grace + TTL (a graceful stop hands every lease back; a plain stop keeps its old rule).
            rowless = [c.item for c in self.pending] if _draining.is_set() else []
            self.held.clear()
            self.pending.clear()
            self.acquire_q = []
        store = store_for(self.alias)
        try:
            self.flush_releases(releases)
            self.flush_handbacks(back + [(item, False, False) for item in rowless])  # cut off: not graceful
            for part in chunks(held, conf.get("LOOM_LEASE_CHUNK")):
                store.expire_many(self.worker_id, part)
            if self.registered:
                store.stop_worker(self.worker_id)
        finally:
            connections[self.alias].close()
        return len(held)


_keepers: dict[str, LeaseKeeper] = {}
_keeper_lock = threading.Lock()


def get_keeper(alias: str | None = None) -> LeaseKeeper:
    """The process's keeper of a shard (default: the bound shard, else the first), created on first use under
    the same worker id as the process's other keepers; its thread starts with the first claim."""
    alias = alias or shards.home()
    keeper = _keepers.get(alias)
    if keeper is None:
        with _keeper_lock:
            keeper = _keepers.get(alias)
            if keeper is None:
                other = next(iter(_keepers.values()), None)
                keeper = _keepers[alias] = LeaseKeeper(other.worker_id if other else None, alias)
    return keeper


def keepers() -> list[LeaseKeeper]:
    """Every keeper this process has (one per shard it has worked on)."""
    return list(_keepers.values())


def reset_keeper(keeper: LeaseKeeper | None = None) -> None:
    """Replace the process's keepers by `keeper` alone, or none (tests; a forked child must not inherit the
    parent's)."""
    with _keeper_lock:
        _keepers.clear()
        if keeper is not None:
            _keepers[keeper.alias] = keeper


def drop_keeper(alias: str, timeout: float = 5.0) -> None:
    """Stop and forget the keeper of a shard this process no longer works on (a benchmark's own aliases)."""
    with _keeper_lock:
        keeper = _keepers.pop(alias, None)
    if keeper is not None:
        keeper.shutdown(timeout)


def install_keeper(keeper: LeaseKeeper) -> None:
    """Make `keeper` the process's keeper of its shard (the worker's heartbeat service, one per shard)."""
    with _keeper_lock:
        _keepers[keeper.alias] = keeper


def _after_fork_in_child() -> None:
    # A forked child (django-q2's worker processes) has none of the parent's threads: its claims
    # are not its own. It starts with fresh keepers under its own id.
    global _keepers, _keeper_lock, _role
    _keepers = {}
    _keeper_lock = threading.Lock()
    if _role == MAIN:
        _role = CHILD


os.register_at_fork(after_in_child=_after_fork_in_child)


def _release_at_exit() -> None:
    """At interpreter exit, send the releases still queued (settled runs' leases wait RELEASE_DELAY to be
    group-committed): a process that exits right after its run settled (a command, a script) would leave the
    row to expire, for the recovery service's pruning to find later. Best effort: the database may be gone."""
    for keeper in keepers():
        with keeper.cond:
            releases, keeper.release_q = keeper.release_q, []
        if not releases:
            continue
        try:
            keeper.flush_releases(releases)
            connections[keeper.alias].close()
        except Exception:  # exiting: nothing left to tell; the recovery service prunes the rows later
            log.debug("lease keeper %s: releases at exit failed", keeper.worker_id, exc_info=True)


atexit.register(_release_at_exit)
