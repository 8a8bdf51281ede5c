"""The JSON views: thin glue between HTTP and journal.flows (docs/http-api.md documents them).

Every API view goes through `api_view`, which checks the method, authenticates (and scopes: see
loomapi/auth.py), gives the request its trace id (loomapi/trace.py), turns ApiError and the
runtime's errors into JSON 4xx, and any other exception into a JSON 500 with an id (logged with its
traceback, never sent). Views are CSRF-exempt: they take a bearer token, not cookies, so a
cross-site form cannot ride on a browser session.

A durable start does not run here: it is queued for a worker (queues.enqueue, the one start
primitive: the execution exists at once, status `queued`) and answered `202 Accepted` at once, so
a long flow never holds a request thread (`?wait=` lets a caller wait, bounded, for the outcome).
Transient calls run here, bounded by LOOM_API_CALL_TIMEOUT (loomapi/calls.py).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.http import HttpResponse
from django.urls import Resolver404, resolve, reverse
from django.views import defaults
from django.views.decorators.csrf import csrf_exempt
from ulid import ULID

import queues
from journal import conf, shards, telemetry
from journal.aggregates.declarations import states
from journal.exceptions import InvalidStream
from journal.flows import (
    TERMINAL,
    ExecutionExists,
    NotResumable,
    UnknownExecution,
    UnknownFlow,
    cancel,
    describe,
    get_flow,
    header_status,
    send,
)
from journal.flows import InvalidInput as FlowInvalidInput
from journal.flows import get_event as read_event
from journal.flows import retry_execution as retry  # (journal.flows.retry is the retry-policy module)
from journal.ids import stored_id_problem
from journal.models import Event
from journal.reach import cannot_reach
from leases.tasks import reservation
from loomapi import errors, trace, worker
from loomapi.auth import Principal, authenticate, require_flow
from loomapi.bodies import (
    body_consumed,
    call_body,
    cancel_reason,
    has_body,
    message_body,
    read_json,
    start_body,
    timeout_seconds,
    wait_seconds,
)
from loomapi.calls import call_with_timeout
from loomapi.listing import list_query, page
from loomapi.state import flow_input, split_result
from queues import InvalidEnqueue, UnknownQueue

logger = logging.getLogger("loomapi")

META = "$meta"
"""Key of the EXECUTION_STARTED payload under which a start records who asked and its trace."""


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> HttpResponse:
    """Strict JSON (ValueError on NaN, the infinities or an int too long to print), unlike JsonResponse."""
    text = json.dumps(data, cls=DjangoJSONEncoder, allow_nan=False)
    return HttpResponse(text, status=status, content_type="application/json", headers=headers)


def api_view(*methods: str, auth: bool = True) -> Callable:
    if "GET" in methods and "HEAD" not in methods:
        methods = (*methods, "HEAD")  # HEAD is a GET without the body (the server drops it)
    allowed = ", ".join(methods)

    def decorate(view: Callable) -> Callable:
        @csrf_exempt
        @functools.wraps(view)
        def wrapper(request, *args, **kwargs):
            current, token = trace.begin(request.headers.get("traceparent"), request.method, view.__name__)
            status = 500
            try:
                response = _serve(view, request, methods, allowed, auth, args, kwargs)
                status = response.status_code
                # Every API response names the worker process that served it: the benchmark counts the
                # first request each worker serves (its cold start); an operator matches a response to a log.
                response["X-Loom-Worker"] = str(os.getpid())
                response["traceparent"] = current.traceparent
                if has_body(request) and not body_consumed(request):
                    # Refused before its body was read (401, 405, 413, 415...): the unread rest would be
                    # parsed as the next request, so the connection is closed, and said to be.
                    response["Connection"] = "close"
                return response
            finally:
                telemetry.request_end(status, view.__name__)  # its span ends; counted by route and status
                trace.end(token)

        return wrapper

    return decorate


def _serve(view: Callable, request, methods, allowed: str, auth: bool, args, kwargs) -> HttpResponse:
    try:
        if request.method not in methods:
            raise errors.MethodNotAllowed(f"{request.method} is not allowed here; use {allowed}",
                                          headers={"Allow": allowed})
        if auth:
            request.loom_principal = authenticate(request)
        return view(request, *args, **kwargs)
    except errors.ApiError as exc:
        return exc.response()
    except UnknownFlow as exc:
        return errors.UnknownFlowError(str(exc)).response()
    except UnknownExecution as exc:
        return errors.UnknownExecutionError(str(exc)).response()
    except FlowInvalidInput as exc:
        return errors.InvalidInput(str(exc)).response()
    except InvalidStream as exc:
        return errors.InvalidBody(f"execution id refused by the journal: {exc}").response()
    except Exception as exc:
        if cannot_reach(exc):  # DatabaseUnavailable, or the driver's own error outside an append: retryable
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            return errors.DatabaseUnavailable(f"the database could not be reached ({first}); retry").response()
        return errors.internal_error(request, exc)
    except (SystemExit, KeyboardInterrupt) as exc:
        # Raised by code a request reached (an input model's validator, a module a flow imports), never by a
        # signal: gunicorn's ThreadWorker serves requests on pool threads and signals reach its main thread.
        # A 500, not the end of the worker process (issue 25).
        return errors.internal_error(request, exc)


@api_view("GET", auth=False)
def health(request):
    """Liveness for load balancers and the benchmark's readiness poll: no auth, no database."""
    return json_response({"status": "ok"})


@api_view("GET", auth=False)
def metrics(request):
    """The Prometheus metrics page (LOOM_METRICS; docs/observability.md). Its labels name every flow, so with
    LOOM_METRICS_AUTH (the default) only a token with access to every flow and execution reads it; any other
    token gets the answer an unknown route gets, as a flow it may not use answers as an unknown one."""

    if not conf.get("LOOM_METRICS"):
        raise errors.NotFound("no such route (metrics are off: LOOM_METRICS)")
    if conf.get("LOOM_METRICS_AUTH"):
        principal = authenticate(request)
        if principal.flows != ("*",) or not principal.read_all:
            raise errors.NotFound("no such route")
    body, content_type = telemetry.exposition()
    return HttpResponse(body, content_type=content_type)


@api_view("POST")
def call(request, name: str):
    """Run a flow transiently: input in, result out, nothing written; optional caller-owned state.

    A flow that raises is answered 200 with status "failed" and its error (the caller keeps its old
    state): the request was served; the flow's own failure is data, as for a durable execution. So
    is a result JSON cannot carry (NaN, an infinity, an integer of more than 4300 digits).
    """
    body = call_body(read_json(request))
    flow = get_flow(name)
    require_flow(request.loom_principal, flow.name)
    outcome = call_with_timeout(flow, flow_input(body))
    if outcome.status != "completed":
        return json_response({"status": outcome.status, "result": None, "error": outcome.error})
    fields = split_result(flow.name, body, outcome.result)
    try:
        return json_response({"status": "completed", **fields, "error": None})
    except ValueError as exc:
        return json_response({"status": "failed", "result": None,
                              "error": f"the flow's result cannot be sent as JSON: {exc}"})


@api_view("POST")
def start_execution(request, name: str):
    """Queue a durable execution for a worker: 202 with its Location at once; idempotent on execution_id.

    The start is queues.enqueue, the one start primitive (the body's queue options: queue, partition_key,
    priority, dedup_id, delay or start_at, timeout): the execution exists from the answer on, status
    `queued`, and a loom_worker's dispatcher begins it within the queue's caps. `?wait=<seconds>` (at most
    LOOM_API_MAX_WAIT) waits for the outcome: 201 with it when the execution settled in time, else 202.
    """

    body = start_body(read_json(request))
    wait = wait_seconds(request)
    flow = get_flow(name)
    principal: Principal = request.loom_principal
    require_flow(principal, flow.name)
    value = flow_input(body)
    flow.prepare(value)  # invalid input is refused (422) before anything is queued
    execution_id = body.execution_id or str(ULID())
    refuse_aggregate_namespace(execution_id)
    header = header_status(execution_id)
    if header is not None:
        return _existing(principal, flow.name, execution_id, header, wait)
    if _stream_exists(execution_id):
        raise errors.ExecutionConflict(f"a journal stream named {execution_id!r} exists and is not an execution; "
                                       "choose another execution_id")
    current = trace.current()
    meta = {"started_by": principal.name, "trace_id": current.trace_id, "span_id": current.span_id}
    telemetry.annotate(execution_id=execution_id, flow=flow.name, queue=body.queue)
    try:
        queued = queues.enqueue(flow.name, value, body.queue, execution_id=execution_id,
                                partition_key=body.partition_key, priority=body.priority, dedup_id=body.dedup_id,
                                run_after=_run_after(body), meta=meta, timeout=body.timeout)
    except ExecutionExists:  # a racing start of the same id won: answered as a repeat of it
        header = header_status(execution_id)
        if header is None:
            raise errors.ExecutionConflict(
                f"execution {execution_id!r} already exists; choose a new execution_id") from None
        return _existing(principal, flow.name, execution_id, header, wait)
    except (InvalidEnqueue, UnknownQueue) as exc:
        raise errors.InvalidBody(str(exc)) from None
    if not queued.created:
        existing = header_status(queued.execution_id)
        if queued.execution_id != execution_id:  # the dedup id is held by a live execution: that one
            return _deduplicated(principal, queued.execution_id, existing, wait)
        return _existing(principal, flow.name, execution_id, existing, wait)
    logger.info("queued start of flow %s as execution %s on queue %s by %s (trace %s)", flow.name, execution_id,
                body.queue, principal.name, current.trace_id)
    location = {"Location": _location(execution_id)}
    status = "queued"
    waiting = waiter() if wait else None
    if wait and not waiting:
        location.update(NOT_WAITED)
    if waiting:
        with waiting:
            header = _wait_settled(execution_id, wait)
        if header is not None:
            status, _, result, error = header
            return json_response({"execution_id": execution_id, "flow": flow.name, "status": status,
                                  "result": result, "error": error or None, "created": True},
                                 status=201, headers=location)
        header = header_status(execution_id)
        if header is not None:
            status = header[0]  # a worker began it: running
    return json_response({"execution_id": execution_id, "flow": flow.name, "status": status, "result": None,
                          "error": None, "created": True}, status=202, headers=location)


def _run_after(body):
    """The start's not-before time from the body's delay or start_at (None: now)."""
    from datetime import timedelta

    from django.utils import timezone

    if body.delay is not None:
        return timezone.now() + timedelta(seconds=body.delay)
    return body.start_at


def _existing(principal: Principal, flow: str, execution_id: str, header: tuple, wait: float):
    """A start of an id that exists: answered as GET would (404) to a token that may not read it; 200 with
    the execution (after up to `wait` seconds for it to settle) when it is the same starter's start of the
    same flow; else 409. Never decided by the input (issue #25: comparing a guessed input with the
    decrypted stored one confirmed withheld personal data to a token that sees it redacted)."""
    existing_flow = header[1]
    starter = _started_by(_started_payload(execution_id))
    if not principal.may_read(starter, existing_flow):
        raise errors.UnknownExecutionError(f"execution {execution_id!r} does not exist")
    if existing_flow != flow:
        raise errors.ExecutionConflict(
            f"execution {execution_id!r} already exists for flow {existing_flow!r}, not {flow!r}")
    if (starter or "") != principal.name:
        raise errors.ExecutionConflict(f"execution {execution_id!r} was started by another starter; "
                                       "choose a new execution_id for a new execution")
    return _answer_existing(execution_id, header, wait)


def _deduplicated(principal: Principal, execution_id: str, header: tuple | None, wait: float) -> HttpResponse:
    """A start whose dedup id a live execution of the queue holds: that execution (200, created false) to a
    token that may read it; else 409 (the dedup id is taken)."""
    if header is None or not principal.may_read(_started_by(_started_payload(execution_id)), header[1]):
        raise errors.ExecutionConflict("the dedup_id is held by a live execution of the queue; choose another")
    return _answer_existing(execution_id, header, wait)


def _answer_existing(execution_id: str, header: tuple, wait: float) -> HttpResponse:
    headers = {"Location": _location(execution_id)}
    if wait and header[0] not in TERMINAL:
        waiting = waiter()
        if not waiting:
            headers.update(NOT_WAITED)
        else:
            with waiting:
                header = _wait_settled(execution_id, wait) or header_status(execution_id) or header
    status, existing_flow, result, error = header
    existing = {"execution_id": execution_id, "flow": existing_flow, "status": status, "result": result,
                "error": error or None, "created": False}
    return json_response(existing, status=200, headers=headers)


NOT_WAITED = {"X-Loom-Wait": "not waited: no request thread free to wait in (loom_serve_api --threads 1 leaves "
                             "none; serve with --threads 2 or more), answered at once"}
"""Said on an answer to `?wait=` / `?timeout=` that could not wait (docs/http-api.md): never silently ignored."""

_waiters: threading.BoundedSemaphore | None = None
_waiters_made = False


def waiter() -> threading.BoundedSemaphore | contextlib.nullcontext | None:
    """A slot to wait in (`?wait=`), or None: wait no longer than it takes to answer.

    In a loom_serve_api worker, at most `--threads` - 1 requests of a process wait at once, so one
    thread is always free for health, status and other requests (a worker accepts connections
    for all its threads, so a busy process still takes new requests and would queue them behind
    the waiters); with one thread, nobody waits. Elsewhere (the test client, runserver): no cap."""
    global _waiters, _waiters_made

    if worker._current is None:
        return contextlib.nullcontext()
    if not _waiters_made:
        _waiters_made = True
        slots = int(worker._current.cfg.threads) - 1
        _waiters = threading.BoundedSemaphore(slots) if slots > 0 else None
    if _waiters is None or not _waiters.acquire(blocking=False):
        return None
    return _Slot(_waiters)


class _Slot:
    def __init__(self, semaphore: threading.BoundedSemaphore):
        self.semaphore = semaphore

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> None:
        self.semaphore.release()


def _wait_settled(execution_id: str, seconds: float) -> tuple | None:
    """Poll the execution's header until it is settled or `seconds` passed; the header, or None."""
    deadline = time.monotonic() + seconds
    pause = 0.02
    while True:
        header = header_status(execution_id)
        if header is not None and header[0] in TERMINAL:
            return header
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        time.sleep(min(pause, left))
        pause = min(pause * 2, 0.5)


@api_view("GET")
def execution(request, execution_id: str):
    """An execution's status, result, error and events; 404 for a stream that is not an execution."""
    return _describe(request, execution_id)


def _describe(request, execution_id: str) -> HttpResponse:
    queued = _queued(request.loom_principal, execution_id)
    if queued is not None:
        return queued
    _readable_header(request.loom_principal, execution_id)
    return json_response(_tree_scoped(request.loom_principal, describe(execution_id, request.loom_principal.reader())))


def _tree_scoped(principal: Principal, described: dict) -> dict:
    """`described` with its `parent` and `children` limited to the executions this token may read: another
    execution's id is shown only under the scope a read of it would pass (a flow outside the token's `flows`,
    an internal `loom.*` one, another token's under "read": "own": omitted, as if it did not exist)."""
    parent = described.get("parent")
    children = described.get("children") or []
    hidden = {each for each in [parent, *children] if isinstance(each, str) and not _may_read_id(principal, each)}
    if not hidden:
        return described
    described["parent"] = None if parent in hidden else parent
    described["children"] = [child for child in children if child not in hidden]
    # The same ids in the steps and events (the $start_child step's result, a `$child:<id>` step, the `$parent`
    # of EXECUTION_STARTED, a wait on the child): shown as HIDDEN.
    return {key: value if key in ("parent", "children") else _hide(value, hidden) for key, value in described.items()}


HIDDEN = "<hidden>"
"""What stands for the id of a parent or child execution this token may not read (docs/http-api.md)."""


def _hide(value, hidden: set[str]):
    if isinstance(value, str):
        if value in hidden:
            return HIDDEN
        return f"$child:{HIDDEN}" if value.startswith("$child:") and value[7:] in hidden else value
    if isinstance(value, dict):
        return {key: _hide(item, hidden) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_hide(item, hidden) for item in value]
    return value


def _may_read_id(principal: Principal, execution_id: str) -> bool:
    """Whether GET of `execution_id` would answer this token (the check of _readable_header, without the 404)."""
    if stored_id_problem(execution_id) is not None:
        return False
    header = header_status(execution_id)
    return header is not None and principal.may_read(_started_by(_started_payload(execution_id)), header[1])


def _queued(principal: Principal, execution_id: str) -> HttpResponse | None:
    """202 `queued` for an id a start reserved that no worker began yet (it has no events); None
    when there is no such reservation or this token may not read it (then the usual 404)."""

    if stored_id_problem(execution_id) is not None or header_status(execution_id) is not None:
        return None
    row = reservation(execution_id)
    if row is None or not principal.may_read(row.started_by or None, row.flow):
        return None
    return json_response({"execution_id": execution_id, "flow": row.flow, "status": "queued", "input": None,
                          "result": None, "error": None, "created_at": row.created_at, "events": []},
                         status=202, headers={"Location": _location(execution_id)})


@api_view("POST", "GET")
def retry_execution(request, execution_id: str):
    """POST: a new attempt of a failed execution, handed to a worker (journal.flows.retry); 202.

    GET: the execution whose id ends in "/retry" (ids may hold "/"), like any other."""
    if request.method in ("GET", "HEAD"):
        return _describe(request, f"{execution_id}/retry")

    principal: Principal = request.loom_principal
    flow = _readable_header(principal, execution_id)[1]
    require_flow(principal, flow)
    current = trace.current()
    try:
        outcome = retry(execution_id, actor={"api": principal.name, "trace_id": current.trace_id}, handoff=True)
    except NotResumable as exc:
        raise errors.ExecutionConflict(str(exc)) from None
    logger.info("retry of execution %s (flow %s) queued by %s (trace %s)", execution_id, flow, principal.name,
                current.trace_id)
    return json_response({"execution_id": execution_id, "flow": flow, "status": outcome.status, "retried": True},
                         status=202, headers={"Location": _location(execution_id)})


@api_view("GET")
def list_executions(request):
    """The executions this token may read, newest first, a page at a time (loomapi/listing.py)."""

    return json_response(page(request.loom_principal, list_query(request.GET)))


@api_view("POST", "GET")
def cancel_execution(request, execution_id: str):
    """POST: cancel a queued, waiting, suspended or running execution (journal.flows.cancel); 200 with its
    outcome. Idempotent: a cancelled one answers 200 `"cancelled": false` (nothing more done); a completed
    or failed one 409 `execution_finished`. GET: the execution whose id ends in "/cancel", like any other."""
    if request.method in ("GET", "HEAD"):
        return _describe(request, f"{execution_id}/cancel")

    principal: Principal = request.loom_principal
    header = _readable_header(principal, execution_id)
    require_flow(principal, header[1])
    reason = cancel_reason(request)
    if header[0] == "cancelled":
        return json_response({"execution_id": execution_id, "flow": header[1], "status": "cancelled",
                              "reason": header[3] or None, "cancelled": False},
                             headers={"Location": _location(execution_id)})
    current = trace.current()
    try:
        outcome = cancel(execution_id, reason or f"cancelled through the API by {principal.name}")
    except NotResumable as exc:  # completed or failed: nothing to cancel
        raise errors.ExecutionFinished(str(exc)) from None
    logger.info("cancel of execution %s (flow %s, was %s) by %s (trace %s)", execution_id, header[1], header[0],
                principal.name, current.trace_id)
    return json_response({"execution_id": execution_id, "flow": header[1], "status": outcome.status,
                          "reason": outcome.error, "cancelled": True, "was": header[0]},
                         headers={"Location": _location(execution_id)})


@api_view("POST", "GET")
def send_message(request, execution_id: str):
    """POST: send a message to an execution (journal.flows.send); 202, idempotent by `message_id`.

    The message is kept until the flow's `ctx.recv(topic)` consumes it (once); a flow waiting on
    the topic is woken at once. GET: the execution whose id ends in "/messages", like any other."""
    if request.method in ("GET", "HEAD"):
        return _describe(request, f"{execution_id}/messages")

    body = message_body(read_json(request))
    principal: Principal = request.loom_principal
    flow = _readable_header(principal, execution_id)[1]
    require_flow(principal, flow)
    try:
        message_id = send(execution_id, body.topic, body.payload, message_id=body.message_id)
    except NotResumable as exc:  # ExecutionFinished: settled, nobody would ever receive it
        raise errors.ExecutionFinished(str(exc)) from None
    except FlowInvalidInput as exc:  # the runtime's own checks of topic, id and payload
        raise errors.InvalidBody(str(exc)) from None
    logger.info("message %s (topic %s) sent to execution %s by %s (trace %s)", message_id, body.topic,
                execution_id, principal.name, trace.current().trace_id)
    return json_response({"execution_id": execution_id, "topic": body.topic, "message_id": message_id,
                          "status": "accepted"}, status=202, headers={"Location": _location(execution_id)})


_UNSET = object()


@api_view("GET")
def get_event(request, execution_id: str, key: str):
    """The value an execution published with `ctx.set_event(key, value)` (journal.flows.get_event).

    `?timeout=<seconds>` (0 to LOOM_API_MAX_WAIT) waits for it, holding a request thread bounded like a
    start's `?wait=` (at most --threads - 1 waiters per process; beyond that it answers at once).
    200 `{"set": true, "value": ...}`, or `{"set": false, "value": null}` if still unset."""

    principal: Principal = request.loom_principal
    timeout = timeout_seconds(request)
    try:
        flow = _readable_header(principal, execution_id)[1]
    except errors.UnknownExecutionError as unknown:
        whole = f"{execution_id}/events/{key}"  # ids may hold "/": the execution named by the whole path
        try:  # only one this token may read: else the 404 for `execution_id`, as if `whole` did not exist
            _readable_header(principal, whole)
        except errors.UnknownExecutionError:
            raise unknown from None
        return _describe(request, whole)
    require_flow(principal, flow)
    try:
        waiting = waiter() if timeout else None
        if waiting:
            with waiting:
                value = read_event(execution_id, key, timeout=timeout, default=_UNSET)
        else:
            value = read_event(execution_id, key, timeout=None, default=_UNSET)
    except FlowInvalidInput as exc:  # a key the runtime refuses
        raise errors.InvalidParameter(str(exc)) from None
    found = value is not _UNSET
    return json_response({"execution_id": execution_id, "key": key, "set": found,
                          "value": value if found else None}, headers=NOT_WAITED if timeout and not waiting else None)


@api_view("GET", "POST", "PUT", "PATCH", "DELETE", auth=False)
def not_found(request, rest: str = ""):
    """Any other path under the API prefix: a JSON 404 rather than Django's HTML page."""
    raise errors.NotFound(f"no API route at {request.path!r}; see docs/http-api.md")


def bad_request(request, exception=None):
    """handler400 of the embedding project: a JSON 400 under the API prefix (a disallowed Host, say),
    Django's own page elsewhere. Set `handler400 = "loomapi.views.bad_request"` in the root URLconf."""
    try:
        in_api = resolve(request.path_info).namespace == "loomapi"
    except Resolver404:
        in_api = False
    if not in_api:
        return defaults.bad_request(request, exception)
    message = "bad request"
    if exception is not None and type(exception).__name__ == "DisallowedHost":
        message = "the Host header names a host this server does not serve (ALLOWED_HOSTS)"
    response = errors.error_response(400, "bad_request", message)
    response["Connection"] = "close"
    return response


def refuse_aggregate_namespace(execution_id: str) -> None:
    """409 for an id in a declared aggregate state's stream namespace (`Ticket-43`): executions and
    aggregates share the journal's stream ids, and an execution there would break the aggregate."""

    for state in states().values():
        if state.prefix and execution_id.startswith(state.prefix):
            raise errors.ExecutionConflict(
                f"execution id {execution_id!r} is in the stream namespace of aggregate state {state.name} "
                f"(prefix {state.prefix!r}); choose another execution_id")


def _readable_header(principal: Principal, execution_id: str) -> tuple:
    """The execution's header if it exists and this token may read it; 404 otherwise (the same answer
    for a stream that is not an execution, an id outside the alphabet and another token's execution,
    so that a scoped token learns nothing of what it may not read)."""
    problem = stored_id_problem(execution_id)  # an id stored before the alphabet stays readable
    if problem is not None:
        raise errors.UnknownExecutionError(f"execution {ascii(execution_id)[:80]} does not exist: {problem}")
    header = header_status(execution_id)
    if header is None or not principal.may_read(_started_by(_started_payload(execution_id)), header[1]):
        raise errors.UnknownExecutionError(f"execution {execution_id!r} does not exist")
    return header


def _started_payload(execution_id: str) -> dict:
    """The EXECUTION_STARTED payload of an execution (its first event): flow, input and $meta."""

    # Through the journal's read: sealed input fields (docs/privacy.md) are compared in clear.
    events = Event.objects.read(execution_id, limit=1)
    payload = events[0].payload if events and events[0].seq == 0 else None
    return payload if isinstance(payload, dict) else {}


def _started_by(started: dict) -> str | None:
    meta = started.get(META)
    return meta.get("started_by") if isinstance(meta, dict) else None


def _stream_exists(stream_id: str) -> bool:
    return Event.objects.using(shards.shard_for(stream_id)).filter(stream_id=stream_id).exists()


def _location(execution_id: str) -> str:
    return reverse("loomapi:execution", kwargs={"execution_id": execution_id})
