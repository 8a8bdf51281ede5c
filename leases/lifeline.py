"""No orphans: every process forked under `loom_worker` dies with the process that forked it.

django-q2's cluster is a tree (loom_worker -> sentinel -> workers, pusher, monitor), and none of
its processes watches its parent: a SIGKILLed `loom_worker` used to leave the whole cluster
running, still taking queued starts. `die_with_parents()` installs fork hooks in the calling
process; they are inherited by every forked descendant, so each child, at every level, asks the
kernel for SIGKILL when the thread that forked it dies (Linux PR_SET_PDEATHSIG). SIGKILL, not
SIGTERM: the parent died without stopping the cluster, so there is nobody to hand back to; the
child's leases expire after LOOM_LEASE_TTL and another worker's sweep takes its runs over, the
same as for the parent itself.

Where prctl is unavailable (not Linux, or it fails), a daemon thread polls the parent pid and
exits hard once the process was re-parented. The race between fork() and prctl() (the parent
dies in between: no signal will ever come) is closed by checking the parent pid after prctl.

Only forks made by a process's main thread arm the hook: PR_SET_PDEATHSIG follows the forking
*thread*, and a flow step forking from a short-lived thread must not lose its child when that
thread ends. (subprocess's fork+exec runs no Python fork hooks unless given a preexec_fn.)
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time

log = logging.getLogger("loom.worker")

_PR_SET_PDEATHSIG = 1
_installed = False
_parent: int | None = None  # pid of the process forking right now (set in the parent, read in the child)


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send `sig` to this process when its parent (thread) dies; False if it cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def _before_fork() -> None:
    global _parent
    _parent = os.getpid() if threading.current_thread() is threading.main_thread() else None


def _after_fork_in_child() -> None:
    parent = _parent
    if parent is None:  # forked from a secondary thread: not one of the worker's own processes
        return
    armed = set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before prctl took effect: no signal will come
        os._exit(1)
    if not armed:
        threading.Thread(target=_watch_parent, args=(parent,), name="loom-parent-watchdog", daemon=True).start()


def die_with_parents() -> None:
    """Make every process forked from now on (by this process or its descendants) die with its parent."""
    global _installed
    if _installed:
        return
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
    _installed = True
