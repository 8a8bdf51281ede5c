"""Transient calls with a deadline: a call that hangs answers 504 and retires the worker that ran it.

A Python thread cannot be stopped from outside, so the call does not run in the request thread:
it runs on a small per-process pool, and the request thread waits for it at most
LOOM_API_CALL_TIMEOUT seconds. Past that, the caller gets `504 call_timeout` with the call's id
(logged with the flow and the trace id), and the worker process retires
(loomapi/worker.py `retire_current_worker`): it stops taking connections, finishes its other
requests, and the arbiter replaces it, so a stuck call holds one dying process, not a slot of the
pool for ever.
"""

from __future__ import annotations

import contextvars
import logging
import os
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from journal import conf
from journal.flows import Flow, Outcome, invoke_transient
from loomapi import trace
from loomapi.errors import CallTimedOut
from loomapi.worker import retire_current_worker

logger = logging.getLogger("loomapi")

_pool: ThreadPoolExecutor | None = None
_pool_pid: int | None = None
_pool_lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    """This process's call pool (made after the fork: threads do not survive one)."""
    global _pool, _pool_pid
    pool, pid = _pool, os.getpid()
    if pool is not None and _pool_pid == pid:
        return pool
    with _pool_lock:
        if _pool is None or _pool_pid != pid:
            _pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="loomapi-call")
            _pool_pid = pid
        return _pool


def _guarded(flow: Flow, value: Any) -> Outcome:
    """invoke_transient, where a BaseException the flow raises (SystemExit, KeyboardInterrupt: a flow, or a
    module it imports, calling sys.exit) is a failed outcome naming it, as any exception is: it must not
    end the API process that serves every other request (the transient runtime catches Exception only)."""
    try:
        return invoke_transient(flow, value)
    except Exception:
        raise  # the runtime's own refusals (InvalidInput...): answered by the view as before
    except BaseException as exc:
        logger.error("flow %s raised %s in a transient call; answered as a failure, the process stays",
                     flow.name, type(exc).__name__)
        return Outcome(None, "failed", None, f"{type(exc).__name__}: {exc} (a flow may not exit the process)")


def _run(flow: Flow, value: Any) -> Outcome:
    from django.db import connections

    try:
        return _guarded(flow, value)
    finally:
        # A pool thread is not a request thread: Django's request_finished does not close its connections.
        connections.close_all()


def call_with_timeout(flow: Flow, value: Any) -> Outcome:
    """invoke_transient(flow, value), bounded by LOOM_API_CALL_TIMEOUT (None: no bound, run here)."""
    timeout = conf.get("LOOM_API_CALL_TIMEOUT")
    if timeout is None:
        return _guarded(flow, value)
    context = contextvars.copy_context()  # the trace id follows the call into the pool thread
    future = _executor().submit(context.run, _run, flow, value)
    try:
        return future.result(timeout=timeout)
    except FutureTimeout:
        call_id = uuid.uuid4().hex
        current = trace.current()
        logger.error("call %s of flow %s timed out after %s s (trace %s); retiring worker %s", call_id, flow.name,
                     timeout, current.trace_id if current else "-", os.getpid())
        retire_current_worker(f"call {call_id} of flow {flow.name} is stuck past {timeout} s")
        raise CallTimedOut(f"call {call_id} of flow {flow.name!r} did not finish within "
                           f"LOOM_API_CALL_TIMEOUT={timeout} s; the worker that ran it is being replaced",
                           call_id=call_id) from None
