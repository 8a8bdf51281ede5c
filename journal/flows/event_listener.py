"""One LISTEN session per process and database alias for every waiting `get_event` (issue 17).

A caller of `get_event(execution_id, key, timeout=...)` on PostgreSQL waits for ctx.set_event's NOTIFY
(`event:<execution_id>` on LOOM_WAIT_CHANNEL). A session of its own per caller would make 64 waiting
HTTP requests 64 more server sessions (max_connections is often 100), so the callers of a process share
one: an `EventListener` per alias, created on first use, whose daemon thread holds the LISTEN session
(`journal/listen.py`: the alias's LOOM_DIRECT address behind PgBouncer, None when it cannot listen) and
wakes the waiters of the execution a notification names. Other payloads on the channel (the due times
of parked waits, for the waker) are ignored here.

What a waiter may rely on: it is woken after any set_event of its execution that committed after it
subscribed, or when the session (re)connects (a notification may have been missed while it was
down). It is not woken while the session is down: get_event re-reads every LOOM_WAIT_POLL anyway. So a
waiter subscribes BEFORE it reads the value, and re-reads after every wake-up or pause.

The thread closes its session and ends after IDLE_SECONDS without a waiter (a process that stopped
waiting keeps no session; the next waiter starts a new one). A forked child forgets its parent's
listeners (their thread does not exist there; their lock may be held by a parent thread).
"""

from __future__ import annotations

import logging
import os
import threading
import time

from journal import conf
from journal.listen import listen, polls_without_direct

log = logging.getLogger("loom.flows")

#: Seconds without a waiter after which the listening session is closed and its thread ends.
IDLE_SECONDS = 10.0
#: Seconds between two attempts to LISTEN while it cannot connect (the waiters poll meanwhile).
RETRY_SECONDS = 2.0
#: How long the thread blocks on the socket before it looks at its waiters and its stop flag.
TICK_SECONDS = 0.5

EVENT_PREFIX = "event:"  # PUT_FLOW_EVENT's and CARRY_FLOW_EVENTS' payload: 'event:' || execution_id


class Waiter:
    """One get_event call's subscription: woken by its execution's notifications (and reconnects)."""

    def __init__(self, listener: EventListener):
        self.listener = listener
        self.execution_id: str | None = None
        self.woken = threading.Event()

    def follow(self, execution_id: str) -> None:
        """Listen for `execution_id` (the run that stands for the execution now) instead of the last one."""
        if execution_id != self.execution_id:
            self.listener._move(self, execution_id)

    def wait(self, timeout: float) -> bool:
        """Until woken or `timeout`; True if woken. The flag is cleared: the caller re-reads next."""
        woken = self.woken.wait(timeout)
        self.woken.clear()
        return woken

    def close(self) -> None:
        self.listener._move(self, None)


class EventListener:
    """The listening session of one alias, shared by every waiting get_event of this process."""

    def __init__(self, alias: str):
        self.alias = alias
        self.pid = os.getpid()
        # One lock for the waiters, the thread slot and the idle clock: a waiter that subscribes while
        # the thread decides to retire either keeps it alive or finds the slot empty and starts another.
        self._lock = threading.Lock()
        self._waiters: dict[str, set[Waiter]] = {}
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._last_waiter = time.monotonic()
        self.connected = False  # tests and diagnostics: whether the session is LISTENing now
        # Behind a pooler without LOOM_DIRECT no session can listen: no thread, the waiters poll (said once).
        self.polling = polls_without_direct(alias, "get_event listener", "LOOM_WAIT_POLL")

    def waiter(self, execution_id: str) -> Waiter:
        """A subscription for `execution_id`, before the caller reads the value (no lost wake-up)."""
        waiter = Waiter(self)
        waiter.follow(execution_id)
        return waiter

    def waiting(self) -> int:
        with self._lock:
            return sum(len(group) for group in self._waiters.values())

    def _move(self, waiter: Waiter, execution_id: str | None) -> None:
        with self._lock:
            if waiter.execution_id is not None:
                group = self._waiters.get(waiter.execution_id)
                if group is not None:
                    group.discard(waiter)
                    if not group:
                        del self._waiters[waiter.execution_id]
            waiter.execution_id = execution_id
            self._last_waiter = time.monotonic()
            if execution_id is None:
                return
            self._waiters.setdefault(execution_id, set()).add(waiter)
            if self._thread is None and not self._stopping.is_set() and not self.polling:
                self._thread = threading.Thread(target=self._run, name=f"loom-get-event-{self.alias}",
                                                daemon=True)
                self._thread.start()

    def _wake(self, execution_id: str | None = None) -> None:
        """Wake the waiters of `execution_id`, or every waiter (None: after a (re)connect)."""
        with self._lock:
            groups = list(self._waiters.values()) if execution_id is None else [
                self._waiters.get(execution_id, ())]
            for group in groups:
                for waiter in group:
                    waiter.woken.set()

    def _retire(self, conn=None) -> bool:
        """Whether the thread ends now: stopped, or no waiter for IDLE_SECONDS. Decided under the lock
        with the slot emptied (and the session closed) at once, so the next waiter starts a new thread
        rather than relying on one that is leaving."""
        with self._lock:
            idle = not self._waiters and time.monotonic() - self._last_waiter >= IDLE_SECONDS
            if not (idle or self._stopping.is_set()):
                return False
            self._thread = None
            self.connected = False
            if conn is not None:
                conn.close()
            return True

    def _run(self) -> None:
        while not self._retire():
            conn = listen(self.alias, conf.get("LOOM_WAIT_CHANNEL"))
            if conn is None:  # cannot LISTEN here (logged by listen(), or a pooler without LOOM_DIRECT)
                self._stopping.wait(RETRY_SECONDS)
                continue
            try:
                self._wake()  # a notification may have been sent while nobody listened: re-read
                self.connected = True
                while not self._retire(conn):
                    for note in conn.notifies(timeout=TICK_SECONDS):
                        if note.payload.startswith(EVENT_PREFIX):
                            self._wake(note.payload[len(EVENT_PREFIX):])
            except Exception as exc:  # the session was lost: the waiters poll until the next connects
                self.connected = False
                conn.close()
                self._wake()  # a waiter that slept on the session (aget_event) re-reads and polls from now on
                if not self._stopping.is_set():
                    log.warning("get_event listener of %s: connection lost (%s); reconnecting", self.alias, exc)
                    self._stopping.wait(0.2)
                continue
            return

    def close(self, timeout: float | None = 5.0) -> None:
        """Stop the thread and close its session (tests, shutdown); the waiters fall back to polling."""
        self._stopping.set()
        with self._lock:
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)


# -- the process's listeners -----------------------------------------------------------------------
_listeners: dict[str, EventListener] = {}
_listeners_lock = threading.Lock()


def listener_for(alias: str) -> EventListener:
    """This process's listener of `alias`, created on first use."""
    listener = _listeners.get(alias)
    if listener is None or listener.pid != os.getpid():
        with _listeners_lock:
            listener = _listeners.get(alias)
            if listener is None or listener.pid != os.getpid():
                listener = _listeners[alias] = EventListener(alias)
    return listener


def close_shared() -> None:
    """Close every listener of this process (tests, shutdown); the next get_event starts a new one."""
    with _listeners_lock:
        listeners = list(_listeners.values())
        _listeners.clear()
    for listener in listeners:
        listener.close()


def _drop_in_child() -> None:
    """After os.fork, in the child: forget the parent's listeners (their thread is not here, their
    session is the parent's, their lock may be held by a parent thread)."""
    global _listeners_lock
    _listeners.clear()
    _listeners_lock = threading.Lock()


os.register_at_fork(after_in_child=_drop_in_child)
