"""Cross-stream coalescing: writes of many concurrent callers merged into one statement per batch.

Every write is one statement and, on PostgreSQL, one notifying commit; commits that notify are
serialised by the server, so many small writes hit a ceiling that more writers cannot lift. The
`Coalescer` takes the writes of many threads (each to its own stream), merges up to `max_batch`
requests of one KIND into one statement (each stream still under its own guards, one notification
for the whole commit) and hands every caller its own outcome.

Kinds: a kind is a name and a batch executor, `executor(using, payloads) -> outcomes`, that runs
ONE statement for many requests and returns, per request in order, its value, the caller's own
exception, or `RETRY` (not written because another request of an all-or-nothing statement
failed: write it again). The journal registers `append` (the guarded multi-stream append);
other apps register theirs with `register_kind` (journal/flows: the bootstrap and the settle of
an execution, each with its header row). This module knows no kind but its own.

How a batch forms: a flush thread takes the oldest waiting request and every other waiting
request of the same kind, up to `max_batch`, and writes them at once. There is no timer: a lone
writer's request is written as soon as a flush thread is free, and requests pile up only while
the flush threads are busy writing, which is exactly when merging pays. Each flush thread owns
its database connection, so thousands of waiting callers need no connection of their own.

Per-caller outcomes: a caller never sees another caller's failure. Requests the executor marks
RETRY are written again without the failed ones, in a new statement; when an executor cannot say
who failed (every request RETRY), each request is written alone.

Adaptive: a caller that finds the coalescer idle (nothing queued, no statement in flight) writes
its own request at once on its own connection, so a lone caller pays no hand-off; only callers
that arrive while a statement is in flight queue for the flush threads. Nothing starts until a
request has to queue. `shared_coalescer()` is what `Event.objects.append`, aggregates' do() and
durable flows use while LOOM_COALESCE is on (the default). A caller inside a transaction (an
atomic block, or autocommit turned off) is not coalesced: its rows must commit or roll back with
its transaction, so its request runs through the same executor, alone, on its own connection.

Faults (docs/coalescing.md, "Faults"): a flush statement waits at most FLUSH_LOCK_TIMEOUT_MS for
a row lock another transaction holds; then the batch is written again request by request, and a
request still blocked goes back to its caller, who writes it directly on its own thread (and waits
there, as without coalescing), so one locked stream never stalls the others. Before each statement
a flush thread checks its connection without a round trip and reconnects if the server dropped it
(nothing was sent, so nothing is retried blindly). A forked child drops the parent's coalescers.
"""

from __future__ import annotations

import os
import threading
import time
from _thread import allocate_lock as _allocate_lock
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from django.core.signals import setting_changed
from django.db import connections
from django.dispatch import receiver

from journal import conf, shards, telemetry
from journal.envelopes import Appended, AppendItem, Envelope
from journal.exceptions import AppendRefused, BatchRefused, JournalError


class CoalescerClosed(JournalError):
    """The coalescer was closed; it accepts no more requests."""


class _Retry:
    """The outcome of a request that was not written because another one failed: write it again."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "RETRY"


RETRY = _Retry()

Executor = Callable[[str, list[Any]], Sequence[Any]]
_kinds: dict[str, Executor] = {}


def register_kind(kind: str, executor: Executor) -> None:
    """Declare a kind of request and the batch executor that writes many of them in one statement.

    The executor runs on a flush thread's connection (`connections[using]`), gets the payloads in
    arrival order (distinct streams) and returns one outcome per payload: a value, an exception
    (that caller's own), or RETRY. An exception it raises goes to every caller of the batch.
    """
    _kinds[kind] = executor


def refusal_outcomes(keys: Sequence[str], errors: dict[str, BaseException]) -> list[Any]:
    """Outcomes of an all-or-nothing statement refused for the streams named in `errors`.

    The named callers get their error, the others RETRY. If every stream of a batch of several is
    named (the server could not attribute a unique violation), all RETRY: the coalescer then
    writes each alone, so an innocent caller never gets someone else's error.
    """
    if len(keys) > 1 and all(key in errors for key in keys):
        return [RETRY] * len(keys)
    return [errors.get(key, RETRY) for key in keys]


class _Done:
    """A one-shot completion flag: one bare lock, held until the outcome is in.

    Cheaper than a threading.Event (a Condition, two locks and Python-level bookkeeping per
    request): setting it is one C-level release, waiting one C-level acquire. Per request that is
    the least a hand-off between two threads can cost.
    """

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = _allocate_lock()
        self._lock.acquire()

    def set(self) -> None:
        self._lock.release()

    def wait(self) -> None:
        self._lock.acquire()
        self._lock.release()

    def is_set(self) -> bool:
        return not self._lock.locked()


class _Request:
    """One caller's write, waiting for its flush; `done` is set once result or error is in, or once
    it is handed back (`handed_back`: its stream is locked elsewhere, the caller writes it itself)."""

    __slots__ = ("done", "error", "handed_back", "key", "kind", "payload", "result")

    def __init__(self, kind: str, key: str, payload: Any):
        self.kind, self.key, self.payload = kind, key, payload
        self.result: Any = None
        self.error: BaseException | None = None
        self.handed_back = False
        self.done = _Done()


# How long a flush statement waits for a row lock held by another transaction (a stream appended
# in someone's open transaction) before the batch is split; see `Coalescer._flush`. Short: a flush
# statement carries other callers' rows, which must not wait for a stranger's commit.
FLUSH_LOCK_TIMEOUT_MS = 100


def _lock_timed_out(exc: BaseException) -> bool:
    """Whether a statement failed because a lock wait exceeded lock_timeout (SQLSTATE 55P03)."""
    seen: BaseException | None = exc
    for _ in range(8):  # the driver's error is the cause of Django's (a short chain; no cycles)
        if seen is None:
            return False
        if getattr(seen, "sqlstate", None) == "55P03":
            return True
        seen = seen.__cause__ or seen.__context__
    return False


# How many times a batch whose commit timed out waiting for a lock that is not a row lock (PostgreSQL's
# notification-queue lock, which every notifying commit takes; see `_row_lock_wait`) is sent again whole
# before it is split like a row-lock timeout. Nothing was written; the wait is the commit queue's.
COMMIT_LOCK_RESENDS = 20


def _row_lock_wait(exc: BaseException) -> bool:
    """Whether a lock timeout was a wait for a row (another transaction's uncommitted append or fence
    advance): PostgreSQL then says where, in the error's context ("while inserting index tuple ...",
    "while locking tuple ..."). A lock timeout without a context is a lock the statement did not ask
    for row by row: at commit, the notification queue's (issue 33: measured with pg_notify alone and
    lock_timeout 1 ms, 55P03 with no context)."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return True  # no driver error found: keep the safe reading (split, hand back)
        diag = getattr(seen, "diag", None)
        if diag is not None:
            return bool(diag.context)
        seen = seen.__cause__ or seen.__context__
    return True


def in_transaction(using: str) -> bool:
    """Whether the caller's connection is inside a transaction whose rows must stay on it: an atomic
    block, or autocommit turned off (set_autocommit(False)). Never opens a connection: with none
    open, autocommit cannot have been turned off."""
    connection = connections[using]
    return connection.in_atomic_block or (connection.connection is not None and not connection.autocommit)


def run_alone(kind: str, payload: Any, using: str | None = None) -> Any:
    """A request written on the caller's own connection through its kind's executor (uncoalesced)."""
    using = using or shards.home()
    outcome = _executor(kind)(using, [payload])[0]
    if outcome is RETRY:
        raise JournalError(f"the {kind} executor asked to retry a request that was alone in its statement")
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


_store_for: Callable[[str], Any] | None = None


def _store(using: str) -> Any:
    """journal.store.store_for, imported on first use as before but only once: an import statement of a
    package's name in the request path runs importlib's Python-level `_handle_fromlist` per request
    (issue 33)."""
    global _store_for
    if _store_for is None:
        from journal.store import store_for

        _store_for = store_for
    return _store_for(using)


def _executor(kind: str) -> Executor:
    try:
        return _kinds[kind]
    except KeyError:
        raise JournalError(f"no coalescing kind {kind!r} is registered") from None


class Coalescer:
    """Merge requests from many threads into one statement per batch and kind (see the module doc).

    max_batch: most requests (streams) per statement; default LOOM_COALESCE_MAX_BATCH.
    flushers: flush threads, each with its own connection, and the most statements the coalescer
    has in flight at once (a lone caller's own included; a request handed back to its caller is
    not); default LOOM_COALESCE_FLUSHERS.
    """

    def __init__(self, using: str | None = None, max_batch: int | None = None, flushers: int | None = None):
        # One coalescer writes to one database: with several shards, the module's functions below keep one
        # per shard, so a batch never spans two shards (one statement per shard).
        self.using = using or shards.home()
        self.max_batch = max_batch if max_batch is not None else conf.get("LOOM_COALESCE_MAX_BATCH")
        self.flushers = flushers if flushers is not None else conf.get("LOOM_COALESCE_FLUSHERS")
        if self.max_batch < 1 or self.flushers < 1:
            raise ValueError("max_batch and flushers must be at least 1")
        self._pending: deque[_Request] = deque()
        self._inflight: set[str] = set()  # streams being written now: their next request waits
        self._active = 0  # statements in flight (flush threads' and lone callers'): at most `flushers`
        # A plain lock under the condition, not the default RLock: nothing here takes it twice, and every
        # request takes it once.
        self._cond = threading.Condition(threading.Lock())
        self._idle = 0  # flush threads waiting on `_cond` for work: a request wakes one only if there is one
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._pid = os.getpid()
        self._forks = _forks  # the process's fork count when this one was made (set again after a fork)
        # Counters for benchmarks and tests: statements run, requests in them, retry rounds after a
        # refusal, the same per kind, the flush threads' time inside statements, and the requests a
        # lone caller wrote itself (no hand-off). All updated under `_cond`, which is held anyway.
        self.statements = 0
        self.batched_requests = 0
        self.retries = 0
        self.direct = 0
        self.fallbacks = 0  # requests handed back to their caller (stream locked elsewhere)
        self.reconnects = 0  # flush connections replaced after the server dropped them
        # Requests of statements rolled back on a lock timeout (counted in `batched_requests` then, and
        # again when re-sent alone, or in `fallbacks` when handed back). The timeout also fires on the
        # commit's wait for PostgreSQL's notification-queue lock when commits are slow (see
        # docs/coalescing.md, "Issue 33").
        self.timed_out = 0
        self.kind_statements: dict[str, int] = {}
        self.kind_requests: dict[str, int] = {}
        self.busy_s = 0.0

    # -- the caller's side ----------------------------------------------------------------------
    def submit(self, kind: str, key: str, payload: Any) -> Any:
        """Write one request of `kind` for stream `key` through a shared statement; block until it
        committed or failed; return its value or raise the caller's own exception.

        Adaptive: a caller that finds the coalescer idle (nothing queued, no statement in flight)
        writes its request itself, at once, on its own connection, exactly as without coalescing:
        a lone caller pays no hand-off. Otherwise it queues and a flush thread merges it with
        whatever else is waiting. Only one caller at a time writes alone, so under load the
        writes go to the flush threads' connections.
        """
        executor = _executor(kind)
        if in_transaction(self.using):
            return run_alone(kind, payload, self.using)
        with self._cond:
            if self._closed:
                raise CoalescerClosed("the coalescer is closed")
            if self._forks != _forks:  # a forked child: not a getpid() system call per request
                self._forked_locked()
            alone = self._active == 0 and not self._pending
            if alone:
                self._active += 1
                self._inflight.add(key)
                self._count_locked(kind, 1)
                self.direct += 1
            else:
                request = _Request(kind, key, payload)
                if not self._threads:
                    self._start_locked()
                self._pending.append(request)
                if self._idle:  # a busy flush thread looks at the queue before it waits again
                    self._cond.notify()
        if alone:
            return self._write_alone(executor, kind, key, payload)
        request.done.wait()
        if request.handed_back:
            return self._write_handed_back(kind, key, payload)
        if request.error is not None:
            raise request.error
        return request.result

    def _write_handed_back(self, kind: str, key: str, payload: Any) -> Any:
        """A request a flush thread could not write because its stream's rows are locked by another
        transaction: the caller writes it directly on its own connection and waits there, as
        without coalescing, taking no statement slot. Its stream stays in flight until then, so
        later requests of the stream still come after it."""
        try:
            return run_alone(kind, payload, self.using)
        finally:
            with self._cond:
                self._inflight.discard(key)
                if self._pending:
                    self._cond.notify()

    def _write_alone(self, executor: Executor, kind: str, key: str, payload: Any) -> Any:
        """The lone caller's request, through its kind's executor on the caller's own connection."""
        began = time.perf_counter()
        try:
            outcome = executor(self.using, [payload])[0]
        finally:
            with self._cond:
                self.busy_s += time.perf_counter() - began
                self._active -= 1
                self._inflight.discard(key)
                if self._pending:
                    self._cond.notify()
        if outcome is RETRY:
            raise JournalError(f"the {kind} executor asked to retry a request that was alone in its statement")
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def append(self, stream_id: str, envelopes: Iterable[Envelope] | Envelope, *, fence_token: int | None = None,
               expected_seq: int | None = None) -> Appended:
        """Like Event.objects.append: guarded by fence token and/or expected tip; this caller's outcome."""
        return self.append_item(AppendItem(stream_id, envelopes, fence_token, expected_seq))

    def append_item(self, item: AppendItem) -> Appended:
        """Append one stream's events through a shared statement (the `append` kind).

        Validation (types, payload size) happens here, in the caller's thread, before anything is
        queued: a bad payload is this caller's InvalidPayload and never reaches a batch.
        """
        encoded = _store(self.using).encode([item])[0]
        return self.submit(APPEND, item.stream_id, (item, encoded))

    def close(self, timeout: float | None = 10.0) -> None:
        """Write what is queued, stop the flush threads and close their connections."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            threads, self._threads = self._threads, []
        for thread in threads:
            thread.join(timeout)

    def __enter__(self) -> Coalescer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the flush threads ----------------------------------------------------------------------
    def _forked_locked(self) -> None:
        """After a fork the parent's threads do not exist here: start afresh. The parent's queued
        requests belong to callers that exist only in the parent: the parent writes them."""
        self._pid, self._threads, self._inflight, self._active = os.getpid(), [], set(), 0
        self._forks, self._idle = _forks, 0
        self._pending = deque()

    def _count_locked(self, kind: str, requests: int) -> None:
        self.statements += 1
        self.batched_requests += requests
        self.kind_statements[kind] = self.kind_statements.get(kind, 0) + 1
        self.kind_requests[kind] = self.kind_requests.get(kind, 0) + requests

    def _start_locked(self) -> None:
        if self._forks != _forks:
            self._forked_locked()
        if self._threads:
            return
        for n in range(self.flushers):
            thread = threading.Thread(target=self._run, name=f"loom-coalesce-{self.using}-{n}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def _take_locked(self) -> list[_Request]:
        """Up to max_batch waiting requests of one kind (the oldest eligible one's), at most one per
        stream, in arrival order. The caller (a flush thread) checks that a statement slot is free.

        A request whose stream is already in this batch or in another statement in flight stays
        queued (in order) for a later batch: one statement cannot hold a stream twice. A request of
        another kind stays queued too, and blocks later requests of its stream: a stream's requests
        are written in the order they arrived.
        """
        if not self._pending:
            return []
        pending = self._pending
        inflight = self._inflight
        first = pending[0]
        if first.key not in inflight and len(pending) <= self.max_batch:
            # The common case under load: every waiting request is of one kind and stream-distinct.
            kind, keys = first.kind, set()
            for request in pending:
                if request.kind != kind or request.key in keys or request.key in inflight:
                    break
                keys.add(request.key)
            else:
                batch = list(pending)
                pending.clear()
                inflight |= keys
                return batch
        batch: list[_Request] = []
        held: list[_Request] = []
        blocked = set(inflight)
        kind = None
        while pending and len(batch) < self.max_batch:
            request = pending.popleft()
            if request.key in blocked or (kind is not None and request.kind != kind):
                blocked.add(request.key)
                held.append(request)
                continue
            kind = request.kind
            blocked.add(request.key)
            batch.append(request)
        pending.extendleft(reversed(held))
        inflight.update(request.key for request in batch)
        return batch

    def _run(self) -> None:
        batch: list[_Request] = []
        try:
            while True:
                with self._cond:
                    if batch:  # the previous batch is written: its streams and its slot are free
                        for request in batch:
                            if not request.handed_back:  # else its caller frees it after writing
                                self._inflight.discard(request.key)
                        self._active -= 1
                    batch = self._take_locked() if self._active < self.flushers else []
                    while not batch:
                        if self._closed and not self._pending:
                            return
                        self._idle += 1
                        try:
                            self._cond.wait()
                        finally:
                            self._idle -= 1
                        batch = self._take_locked() if self._active < self.flushers else []
                    self._active += 1
                    if self._pending:  # more than this batch waits: another flush thread may take it
                        self._cond.notify()
                self._flush(batch)
        finally:
            connections[self.using].close()

    def _flush(self, batch: list[_Request]) -> None:
        """Write the batch (one kind); requests marked RETRY are written again without the others."""
        store_for = _store
        kind = batch[0].kind
        executor = _executor(kind)
        remaining = batch
        resends = 0
        while remaining:
            try:
                # A connection the server dropped while idle (restart, idle timeout, terminated) is
                # replaced before anything is sent, so the batch is written, not failed; and the
                # statement may wait only briefly for row locks (see FLUSH_LOCK_TIMEOUT_MS).
                if store_for(self.using).prepare_flush_connection(FLUSH_LOCK_TIMEOUT_MS):
                    with self._cond:
                        self.reconnects += 1
            except BaseException as exc:  # cannot connect: nothing was sent, nothing written
                for request in remaining:
                    self._finish(request, error=exc)
                return
            with self._cond:
                self._count_locked(kind, len(remaining))
            telemetry.observe("batch", len(remaining), kind=kind)  # metrics (a no-op when off)
            began = time.perf_counter()
            try:
                outcomes = executor(self.using, [r.payload for r in remaining])
                if len(outcomes) != len(remaining):
                    raise JournalError(f"the {kind} executor returned {len(outcomes)} outcomes for "
                                       f"{len(remaining)} requests")
            except BaseException as exc:
                self._add_busy(began)
                if _lock_timed_out(exc):  # rolled back: nothing written; some stream is locked elsewhere
                    with self._cond:
                        self.timed_out += len(remaining)
                    if not _row_lock_wait(exc) and resends < COMMIT_LOCK_RESENDS:
                        resends += 1  # the commit queued for the notify lock: the same batch again
                        continue
                    if len(remaining) == 1:
                        self._hand_back(remaining[0])
                    else:  # each alone: the free ones are written, the locked ones handed back
                        for request in remaining:
                            self._flush([request])
                    return
                # Database down, connection lost mid-statement...: everyone in it, as direct. The
                # outcome of a statement cut off after it was sent is unknown (it may have
                # committed), so it is not retried here: the callers get the error.
                connections[self.using].close_if_unusable_or_obsolete()
                for request in remaining:
                    self._finish(request, error=exc)
                return
            self._add_busy(began)
            retry = [r for r, outcome in zip(remaining, outcomes, strict=True) if outcome is RETRY]
            if len(retry) == len(remaining):  # nobody was told apart: each alone
                if len(remaining) == 1:
                    self._finish(remaining[0], error=JournalError(
                        f"the {kind} executor asked to retry a request that was alone in its statement"))
                    return
                for request in remaining:
                    self._flush([request])
                return
            # Hand the outcomes back in one pass: each caller's result or error, then its wake-up.
            for request, outcome in zip(remaining, outcomes, strict=True):
                if outcome is RETRY:
                    continue
                if isinstance(outcome, BaseException):
                    request.error = outcome
                else:
                    request.result = outcome
                request.done.set()
            if retry:
                with self._cond:
                    self.retries += 1
            remaining = retry

    def _add_busy(self, began: float) -> None:
        with self._cond:
            self.busy_s += time.perf_counter() - began

    def _hand_back(self, request: _Request) -> None:
        """The caller writes this request itself (its stream's rows are locked by another transaction)."""
        with self._cond:
            self.fallbacks += 1
        request.handed_back = True
        request.done.set()

    @staticmethod
    def _finish(request: _Request, result: Any = None, error: BaseException | None = None) -> None:
        request.result, request.error = result, error
        request.done.set()


def __getattr__(name: str) -> Any:
    """`CoalescingAppender`, the first name of the Coalescer (when it coalesced journal appends only), answers
    for one more release with a DeprecationWarning, so code importing it is told before it goes (0.3)."""
    if name == "CoalescingAppender":
        import warnings

        warnings.warn("journal.coalesce.CoalescingAppender is deprecated and goes in 0.3: use Coalescer",
                      DeprecationWarning, stacklevel=2)
        return Coalescer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- the journal's own kind: the guarded multi-stream append ------------------------------------
APPEND = "journal.append"


def _append_executor(using: str, payloads: list[tuple[AppendItem, list[str]]]) -> list[Any]:
    """JournalStore.append_encoded for many streams: all or nothing, refused streams named."""
    items = [item for item, _ in payloads]
    try:
        return _store(using).append_encoded(items, [encoded for _, encoded in payloads])
    except BatchRefused as exc:
        return refusal_outcomes([item.stream_id for item in items], exc.errors)
    except AppendRefused as exc:  # a batch of one: its own refusal
        return [exc]


register_kind(APPEND, _append_executor)


# -- the process-wide coalescer (LOOM_COALESCE) ---------------------------------------------------
_shared: dict[str, Coalescer] = {}
_shared_lock = threading.Lock()
_forks = 0  # forks this process is the child of (os.register_at_fork below): coalescers compare it


def enabled() -> bool:
    """Whether appends and durable flows route their writes through the coalescer (LOOM_COALESCE)."""
    return conf.get("LOOM_COALESCE")


def shared_coalescer(using: str | None = None) -> Coalescer:
    """This process's coalescer for a database alias (a shard), created on first use with the settings."""
    using = using or shards.home()
    coalescer = _shared.get(using)
    if coalescer is None or coalescer._closed:
        with _shared_lock:
            coalescer = _shared.get(using)
            if coalescer is None or coalescer._closed:
                coalescer = _shared[using] = Coalescer(using)
    return coalescer


shared_appender = shared_coalescer


def _drop_shared_in_child() -> None:
    """After os.fork, in the child: forget the parent's coalescers (their flush threads do not exist
    here, their queues hold the parent's callers' requests, their locks may be held by a parent
    thread). The child's first request creates its own."""
    global _shared_lock, _forks
    _forks += 1
    _shared.clear()
    _shared_lock = threading.Lock()


os.register_at_fork(after_in_child=_drop_shared_in_child)


@receiver(setting_changed)
def _follow_settings(setting: str, **kwargs: Any) -> None:
    """The shared coalescers follow LOOM_COALESCE_* (tests and benchmarks change them at run time):
    a change closes them, and the next request creates one with the new values."""
    if setting.startswith("LOOM_COALESCE_"):
        close_shared()


def running(using: str | None = None) -> Coalescer | None:
    """The shared coalescer of an alias if one is open (for its counters), without creating one."""
    using = using or shards.home()
    coalescer = _shared.get(using)
    return None if coalescer is None or coalescer._closed else coalescer


def close_shared() -> None:
    """Close every shared coalescer (tests, benchmarks, shutdown)."""
    with _shared_lock:
        coalescers = list(_shared.values())
        _shared.clear()
    for coalescer in coalescers:
        coalescer.close()


def submit(kind: str, key: str, payload: Any, using: str | None = None) -> Any:
    """One request of `kind`: coalesced when LOOM_COALESCE is on, else alone on this connection. The
    request goes to the coalescer of its stream's shard: `using` when the caller has it (a durable run's
    writer passes its bound alias), else journal.shards.shard_for(key)."""
    using = using or shards.shard_for(key)
    if enabled():
        return shared_coalescer(using).submit(kind, key, payload)
    return run_alone(kind, payload, using)


def append_item(item: AppendItem, using: str | None = None) -> Appended:
    """The mid-run append of durable flows: coalesced when LOOM_COALESCE is on, else direct; on the
    stream's shard (`using`, or journal.shards.shard_for)."""
    using = using or shards.shard_for(item.stream_id)
    if enabled():
        return shared_coalescer(using).append_item(item)
    from journal.store import store_for

    return store_for(using).append_batch([item])[0]
