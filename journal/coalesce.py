"""Cross-stream coalescing: appends of many concurrent writers merged into one guarded statement.

Every append is one statement and, on PostgreSQL, one notifying commit; commits that notify are
serialised by the server, so many small appends hit a ceiling that more writers cannot lift. The
`CoalescingAppender` takes the appends of many threads (each to its own stream), merges up to
`max_batch` of them into one `append_batch`-shaped statement (each stream still under its own
fence and sequence guard, one notification for the whole commit) and hands every caller its own
outcome.

How a batch forms: a flush thread takes whatever requests are waiting, up to `max_batch`, and
writes them at once. There is no timer: a lone writer's request is written as soon as a flush
thread is free, and requests pile up only while the flush threads are busy writing, which is
exactly when merging pays. Each flush thread owns its database connection, so thousands of
waiting callers need no connection of their own.

Per-caller outcomes: the statement is all or nothing, so when some rows fail their guard the
store names them (BatchRefused.errors); those callers get their own error and the others are
written again without them, in a new statement. A caller never sees another caller's failure.

Inert unless used: nothing starts until the first `append`; `shared_appender()` is what durable
flows use when LOOM_COALESCE is on. A caller inside a transaction (atomic block) is not
coalesced: its rows must commit or roll back with its transaction, so it appends directly.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Iterable

from django.db import connections

from journal import conf
from journal.envelopes import Appended, AppendItem, Envelope
from journal.exceptions import AppendRefused, BatchRefused, JournalError


class CoalescerClosed(JournalError):
    """The coalescer was closed; it accepts no more appends."""


class _Request:
    """One caller's append, waiting for its flush; `done` is set once result or error is in."""

    __slots__ = ("done", "encoded", "error", "item", "result")

    def __init__(self, item: AppendItem, encoded: list[str]):
        self.item, self.encoded = item, encoded
        self.result: Appended | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()


class CoalescingAppender:
    """Merge appends from many threads into multi-row guarded statements (see the module doc).

    max_batch: most streams (requests) per statement; default LOOM_COALESCE_MAX_BATCH.
    flushers: flush threads, each with its own connection; default LOOM_COALESCE_FLUSHERS.
    """

    def __init__(self, using: str = "default", max_batch: int | None = None, flushers: int | None = None):
        self.using = using
        self.max_batch = max_batch if max_batch is not None else conf.get("LOOM_COALESCE_MAX_BATCH")
        self.flushers = flushers if flushers is not None else conf.get("LOOM_COALESCE_FLUSHERS")
        if self.max_batch < 1 or self.flushers < 1:
            raise ValueError("max_batch and flushers must be at least 1")
        self._pending: deque[_Request] = deque()
        self._inflight: set[str] = set()  # streams being written now: their next request waits
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._pid = os.getpid()
        # Counters for benchmarks and tests (statements run, rows written, retries after a refusal).
        self.statements = 0
        self.batched_requests = 0
        self.retries = 0
        self._counts = threading.Lock()

    # -- the caller's side ----------------------------------------------------------------------
    def append(self, stream_id: str, envelopes: Iterable[Envelope] | Envelope, *, fence_token: int | None = None,
               expected_seq: int | None = None) -> Appended:
        """Like Event.objects.append: guarded by fence token and/or expected tip; this caller's outcome."""
        return self.append_item(AppendItem.build(stream_id, envelopes, fence_token, expected_seq))

    def append_item(self, item: AppendItem) -> Appended:
        """Append one stream's events through a shared statement; block until it committed or failed.

        Validation (types, payload size) happens here, in the caller's thread, before anything is
        queued: a bad payload is this caller's InvalidPayload and never reaches a batch.
        """
        from journal.store import store_for

        store = store_for(self.using)
        encoded = store.encode([item])[0]
        if connections[self.using].in_atomic_block:
            return store.append_encoded([item], [encoded])[0]
        request = _Request(item, encoded)
        with self._cond:
            if self._closed:
                raise CoalescerClosed("the coalescing appender is closed")
            self._start_locked()
            self._pending.append(request)
            self._cond.notify()
        request.done.wait()
        if request.error is not None:
            raise request.error
        assert request.result is not None
        return request.result

    def close(self, timeout: float | None = 10.0) -> None:
        """Write what is queued, stop the flush threads and close their connections."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            threads, self._threads = self._threads, []
        for thread in threads:
            thread.join(timeout)

    def __enter__(self) -> CoalescingAppender:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the flush threads ----------------------------------------------------------------------
    def _start_locked(self) -> None:
        if self._pid != os.getpid():  # forked: the parent's threads do not exist here
            self._pid, self._threads, self._inflight = os.getpid(), [], set()
        if self._threads:
            return
        for n in range(self.flushers):
            thread = threading.Thread(target=self._run, name=f"loom-coalesce-{self.using}-{n}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def _take_locked(self) -> list[_Request]:
        """Up to max_batch waiting requests, oldest first, at most one per stream.

        A request whose stream is already in this batch or in another flusher's statement stays
        queued (in order) for a later batch: one statement cannot hold a stream twice, and a
        stream's requests are written in the order they arrived.
        """
        batch: list[_Request] = []
        held: list[_Request] = []
        streams = self._inflight
        while self._pending and len(batch) < self.max_batch:
            request = self._pending.popleft()
            sid = request.item.stream_id
            if sid in streams:
                held.append(request)
                continue
            streams.add(sid)
            batch.append(request)
        self._pending.extendleft(reversed(held))
        return batch

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    batch = self._take_locked()
                    while not batch:
                        if self._closed and not self._pending:
                            return
                        self._cond.wait()
                        batch = self._take_locked()
                try:
                    self._flush(batch)
                finally:
                    with self._cond:
                        for request in batch:
                            self._inflight.discard(request.item.stream_id)
                        if self._pending:  # held requests of these streams may go now
                            self._cond.notify()
        finally:
            connections[self.using].close()

    def _flush(self, batch: list[_Request]) -> None:
        """Write the batch; on a guard refusal, fail only the refused rows and write the rest again."""
        from journal.store import store_for

        store = store_for(self.using)
        remaining = batch
        while remaining:
            with self._counts:
                self.statements += 1
                self.batched_requests += len(remaining)
            try:
                results = store.append_encoded([r.item for r in remaining], [r.encoded for r in remaining])
            except BatchRefused as exc:
                refused = [r for r in remaining if r.item.stream_id in exc.errors]
                if len(refused) == len(remaining) and len(remaining) > 1:
                    # Every stream named (a unique violation the server did not attribute):
                    # write each on its own, so only the true culprit gets an error.
                    for request in remaining:
                        self._flush([request])
                    return
                for request in refused:
                    self._finish(request, error=exc.errors[request.item.stream_id])
                remaining = [r for r in remaining if r.item.stream_id not in exc.errors]
                with self._counts:
                    self.retries += 1
                continue
            except AppendRefused as exc:  # a batch of one: its own refusal
                self._finish(remaining[0], error=exc)
                return
            except BaseException as exc:  # database down, connection lost...: everyone in it, as direct
                connections[self.using].close_if_unusable_or_obsolete()
                for request in remaining:
                    self._finish(request, error=exc)
                return
            for request, appended in zip(remaining, results, strict=True):
                self._finish(request, result=appended)
            return

    @staticmethod
    def _finish(request: _Request, result: Appended | None = None, error: BaseException | None = None) -> None:
        request.result, request.error = result, error
        request.done.set()


_shared: dict[str, CoalescingAppender] = {}
_shared_lock = threading.Lock()


def enabled() -> bool:
    """Whether durable flows route their appends through the coalescer (LOOM_COALESCE)."""
    return conf.get("LOOM_COALESCE")


def shared_appender(using: str = "default") -> CoalescingAppender:
    """This process's coalescer for a database alias, created on first use with the settings."""
    appender = _shared.get(using)
    if appender is None or appender._closed:
        with _shared_lock:
            appender = _shared.get(using)
            if appender is None or appender._closed:
                appender = _shared[using] = CoalescingAppender(using)
    return appender


def close_shared() -> None:
    """Close every shared coalescer (tests, benchmarks, shutdown)."""
    with _shared_lock:
        appenders = list(_shared.values())
        _shared.clear()
    for appender in appenders:
        appender.close()


def append_item(item: AppendItem, using: str = "default") -> Appended:
    """The one append of durable flows: coalesced when LOOM_COALESCE is on, else direct."""
    if enabled():
        return shared_appender(using).append_item(item)
    from journal.store import store_for

    return store_for(using).append_batch([item])[0]
