"""Gunicorn configuration and hooks of the API server: warm workers, and no orphans.

loom_serve_api loads this module; it also works on its own for a project's WSGI module:

    gunicorn -c python:loomapi.gunicorn_conf yourproject.wsgi

Why gunicorn: it is a mature pre-fork WSGI server already in our dependencies; Django and
journal.flows are synchronous, so an ASGI server (uvicorn, granian) would only push each request
onto a thread. The worker is loomapi.worker.BufferingWorker: gunicorn's gthread worker (keep-alive
connections) whose main loop buffers each request whole before a thread sees it, so clients that
send part of a request and stall cannot hold the request threads (see loomapi/worker.py).

Warm: the app is preloaded in the arbiter (Django set up, URLconfs and so views and flow
modules imported) before any fork; every worker then opens its database connections in the
threads that will serve requests, before it accepts its first request.

No orphans: each worker asks the kernel for SIGTERM when its parent dies (PR_SET_PDEATHSIG), so
a SIGKILLed arbiter still takes its workers with it: gracefully, in-flight requests finish within
graceful_timeout. A watchdog thread bounds that: if the worker outlives its parent by more than
graceful_timeout + 2 s (a request stuck in a thread), it exits hard. Gunicorn's own check
(worker.ppid != os.getppid(), once a second) is a third line.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time

worker_class = "loomapi.worker.BufferingWorker"
threads = 1
keepalive = 5
preload_app = True
graceful_timeout = 10
timeout = 30
# gunicorn's control socket lives at one path per user: two servers on one host would collide.
control_socket_disable = True
# The access log (loom_serve_api --access-log) names each request's trace id (W3C traceparent, loomapi/trace.py).
access_log_format = '%(h)s %(l)s %(u)s %(t)s "%(r)s" %(s)s %(b)s "%(f)s" "%(a)s" traceparent=%({traceparent}o)s'

logger = logging.getLogger("loomapi.server")

_PR_SET_PDEATHSIG = 1


def set_parent_death_signal(sig: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send `sig` to this process when its parent dies (Linux); False elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        logger.warning("prctl(PR_SET_PDEATHSIG) failed: errno %s", ctypes.get_errno())
        return False
    return True


def _watch_parent(parent: int, grace: float) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    time.sleep(grace)
    os._exit(1)


def pre_fork(server, worker) -> None:
    # A database connection must never cross a fork: two processes on one socket corrupt it.
    from django.db import connections

    connections.close_all()


def post_fork(server, worker) -> None:
    set_parent_death_signal(signal.SIGTERM)
    # The parent may have died between fork() and prctl(): then no signal will ever come.
    if os.getppid() != server.pid:
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(server.pid, float(server.cfg.graceful_timeout) + 2.0),
                     name="loomapi-parent-watchdog", daemon=True).start()


def post_worker_init(worker) -> None:
    """Open the database connections in every request thread before the first request."""
    pool = getattr(worker, "tpool", None)
    if pool is None:  # sync worker: requests run in the main thread
        open_connections()
        return
    count = max(1, int(worker.cfg.threads))
    # A barrier makes the executor start `count` distinct threads, one task each.
    barrier = threading.Barrier(count)

    def warm() -> None:
        barrier.wait(timeout=30)
        open_connections()

    for future in [pool.submit(warm) for _ in range(count)]:
        future.result(timeout=60)


def open_connections() -> None:
    from django.db import connections

    for alias in connections:
        connections[alias].ensure_connection()
