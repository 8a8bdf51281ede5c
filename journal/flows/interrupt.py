"""Steps that can be interrupted: a running step's heartbeat, and what it is told while it runs.

A step's function cannot be stopped from outside (Python threads cannot be killed), so a step is *told*:

    def fetch(url):
        for chunk in download(url):
            heartbeat({"bytes": len(chunk)})   # or ctx.heartbeat(...): raises once the step must stop
            ...
        if cancelled(): ...                   # or ctx.cancelled(): look without raising

`heartbeat()` and `cancelled()` find the running step through a context variable (the step runs in the run's
thread), so the step's function needs no argument for them; outside a step they do nothing (False).

A step is told to stop when its `timeout` passed (`StepTimedOut`, a DeadlineExceeded: the attempt fails as
timed out), when its run lost its claim (a `cancel()` or a takeover moved the fence: the lease keeper sees it
at its next renewal), when its `heartbeat_timeout` passed without a heartbeat, or when its worker retires
(`StepCancelled`). A step that ignores it is abandoned LOOM_STEP_ABANDON_AFTER seconds later by the worker's
watchdog (leases/watchdog.py): its thread is left behind and the worker process retires and is replaced, the
way the API retires a worker whose call hung (loomapi/worker.py). Exactly-once rules do not change: a step
told to stop is never recorded as completed (its run's writes are refused by the fence, or it fails).

The registry of running steps is this process's memory only; the watchdog reads it, nothing durable does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from journal import conf
from journal.flows.errors import StepCancelled, StepTimedOut

TIMEOUT, CANCELLED, HEARTBEAT, RETIRING = "timeout", "cancelled or taken over", "heartbeat timeout", "worker retiring"


class RunningStep:
    """One attempt of one step in progress in this process: what the watchdog and heartbeat() look at."""

    __slots__ = ("attempt", "claim", "deadline", "details", "execution_id", "heartbeat_timeout", "last_beat",
                 "name", "pos", "reason", "started", "thread", "told_at")

    def __init__(self, execution_id: str, name: str, pos: int, attempt: int, claim: Any,
                 timeout: float | None, heartbeat_timeout: float | None):
        self.execution_id, self.name, self.pos, self.attempt, self.claim = execution_id, name, pos, attempt, claim
        self.started = self.last_beat = time.monotonic()
        self.deadline = None if timeout is None else self.started + timeout
        self.heartbeat_timeout = heartbeat_timeout
        self.details: Any = None
        self.reason: str | None = None  # why it was told to stop (None: it was not)
        self.told_at: float | None = None
        self.thread = threading.current_thread()

    def tell(self, reason: str) -> bool:
        """Tell the step to stop (the first reason wins); True if it was not told before."""
        if self.reason is not None:
            return False
        self.reason, self.told_at = reason, time.monotonic()
        return True

    def refresh(self, now: float | None = None) -> str | None:
        """Look at what may have happened since: the timeout passed, the claim was lost; the reason, if any."""
        now = time.monotonic() if now is None else now
        if self.reason is None:
            if self.deadline is not None and now > self.deadline:
                self.tell(TIMEOUT)
            elif self.claim is not None and self.claim.lost:
                self.tell(CANCELLED)
        return self.reason

    def beat(self, details: Any = None) -> None:
        self.last_beat = time.monotonic()
        if details is not None:
            self.details = details
        reason = self.refresh(self.last_beat)
        if reason == TIMEOUT:
            raise StepTimedOut(f"deadline exceeded: step {self.name!r} ran past its timeout (told at a heartbeat)")
        if reason is not None:
            raise StepCancelled(f"step {self.name!r} of execution {self.execution_id!r} was told to stop: {reason}")

    def __repr__(self) -> str:
        return f"<RunningStep {self.execution_id}#{self.pos} {self.name} attempt {self.attempt}>"


_current: ContextVar[RunningStep | None] = ContextVar("loom_running_step", default=None)
_lock = threading.Lock()
_running: dict[int, RunningStep] = {}
_abandoned: dict[int, RunningStep] = {}  # told, ignored it past the bound: their threads are left behind


@contextmanager
def running(execution_id: str, name: str, pos: int, attempt: int, claim: Any, timeout: float | None,
            heartbeat_timeout: float | None) -> Iterator[RunningStep]:
    """The step's function runs inside: heartbeat() and cancelled() find it, the watchdog sees it."""
    step = RunningStep(execution_id, name, pos, attempt, claim, timeout, heartbeat_timeout)
    token = _current.set(step)
    with _lock:
        _running[id(step)] = step
    try:
        yield step
    finally:
        with _lock:
            _running.pop(id(step), None)
            _abandoned.pop(id(step), None)
        _current.reset(token)


def current() -> RunningStep | None:
    """The step running in this thread (context), or None."""
    return _current.get()


def heartbeat(details: Any = None) -> None:
    """From inside a step: it is alive (`details`, JSON, are kept in memory for the watchdog's log). Raises
    StepTimedOut past its timeout and StepCancelled once it was told to stop; outside a step it does nothing."""
    step = _current.get()
    if step is not None:
        step.beat(details)


def cancelled() -> bool:
    """From inside a step: whether it was told to stop (see heartbeat); False outside a step."""
    step = _current.get()
    return step is not None and step.refresh() is not None


def running_steps() -> list[RunningStep]:
    with _lock:
        return list(_running.values())


def abandon(step: RunningStep) -> None:
    """The watchdog gave up on `step`: a graceful shutdown does not wait for its thread."""
    with _lock:
        if id(step) in _running:
            _abandoned[id(step)] = step


def abandoned_threads() -> set[threading.Thread]:
    with _lock:
        return {step.thread for step in _abandoned.values()}


def abandoned_executions() -> set[str]:
    with _lock:
        return {step.execution_id for step in _abandoned.values()}


def abandon_after() -> float:
    return conf.get("LOOM_STEP_ABANDON_AFTER")


def cancel_bound() -> float | None:
    """Seconds within which a cancelled execution's running step elsewhere is told and stops or is abandoned:
    the lease keeper's renewal (it sees the fence moved) plus LOOM_STEP_ABANDON_AFTER; None without leases."""
    try:
        renew = conf.get("LOOM_LEASE_RENEW_EVERY")
    except conf.UnknownSetting:
        return None
    return renew + abandon_after() + 1.0  # + the watchdog's poll and the retiring process's hand-back
