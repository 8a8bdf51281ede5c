"""A run that cannot reach the database is not a failed attempt of its flow (issue #35).

During a connection spike (`FATAL: sorry, too many clients already`) a woken or recovered run fails at its first
statement, before any of the flow's code ran. Counted as an attempt, each takeover of it brought it closer to
`stuck` for good. Here: such a failure is recognised (`cannot_reach`), and the run is tried again with backoff
(`patiently`) under the same fence token, for up to LOOM_RECOVERY_PATIENCE seconds, until it reaches the database
or someone else took the execution over (then that run goes on; this one stops).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import InterfaceError, OperationalError, connections

from leases import conf

log = logging.getLogger("loom.recovery")
T = TypeVar("T")

FIRST_BACKOFF = 0.1  # seconds before the first retry; doubled each time up to MAX_BACKOFF
MAX_BACKOFF = 2.0
# What a driver says when the server cannot be reached or took the session away (psycopg's texts; the server's
# FATALs of a full or restarting server). A lock timeout, a deadlock, a constraint: not these, the run's own.
_SIGNS = ("too many clients", "remaining connection slots", "connection failed", "could not connect",
          "connection refused", "server closed the connection", "terminating connection", "connection is closed",
          "connection already closed", "the database system is", "no connection to the server", "connection timeout",
          "timeout expired", "connection to server", "consuming input failed", "ssl connection has been closed",
          "could not receive data", "could not send data", "connection reset", "broken pipe",
          "couldn't get a connection")  # Django's own pool (OPTIONS["pool"]) with every session taken


def cannot_reach(exc: BaseException) -> bool:
    """Whether `exc` (or what it was raised from) says the database could not be reached, rather than refusing
    a statement."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, InterfaceError):
            return True
        if isinstance(current, OperationalError):
            text = str(current).lower()
            if any(sign in text for sign in _SIGNS):
                return True
        current = current.__cause__ or current.__context__
    return False


def patiently(attempt: Callable[[], T], what: str, stopping: Callable[[], bool] = lambda: False) -> T:
    """`attempt()`, tried again with backoff while it fails because the database cannot be reached, for up to
    LOOM_RECOVERY_PATIENCE seconds (then its last error is raised); any other outcome is returned or raised at
    once. This thread's sessions are closed between tries, so that each try connects afresh."""
    deadline = time.monotonic() + conf.get("LOOM_RECOVERY_PATIENCE")
    pause, tries = FIRST_BACKOFF, 0
    while True:
        try:
            return attempt()
        except Exception as exc:
            if not cannot_reach(exc) or time.monotonic() + pause > deadline or stopping():
                raise
            tries += 1
            if tries == 1 or tries % 10 == 0:
                log.warning("%s: the database cannot be reached (%s: %s); retrying (not an attempt of the flow)",
                            what, type(exc).__name__, str(exc).strip().splitlines()[0][:200] if str(exc) else "")
            connections.close_all()
            time.sleep(pause)
            pause = min(MAX_BACKOFF, pause * 2)
