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

from django.db import connections

from journal.reach import cannot_reach
from leases import conf

log = logging.getLogger("loom.recovery")
T = TypeVar("T")
__all__ = ["cannot_reach", "patiently"]  # cannot_reach: journal/reach.py, kept importable here

FIRST_BACKOFF = 0.1  # seconds before the first retry; doubled each time up to MAX_BACKOFF
MAX_BACKOFF = 2.0


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
