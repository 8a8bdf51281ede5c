"""The JSON views: thin glue between HTTP and journal.flows (docs/http-api.md documents them).

Every API view goes through `api_view`, which checks the method, authenticates, turns ApiError
and the runtime's errors into JSON 4xx, and any other exception into a JSON 500 with an id
(logged with its traceback, never sent). Views are CSRF-exempt: they take a bearer token, not
cookies, so a cross-site form cannot ride on a browser session.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

from django.http import JsonResponse
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt

from journal.exceptions import InvalidStream
from journal.flows import (
    ExecutionExists,
    UnknownExecution,
    UnknownFlow,
    describe,
    get_flow,
    invoke_transient,
    load_state,
    start,
)
from journal.flows import InvalidInput as FlowInvalidInput
from loomapi import errors
from loomapi.auth import authenticate
from loomapi.bodies import call_body, read_json, start_body
from loomapi.state import flow_input, split_result


def api_view(*methods: str, auth: bool = True) -> Callable:
    allowed = ", ".join(methods)

    def decorate(view: Callable) -> Callable:
        @csrf_exempt
        @functools.wraps(view)
        def wrapper(request, *args, **kwargs):
            try:
                if request.method not in methods:
                    raise errors.MethodNotAllowed(f"{request.method} is not allowed here; use {allowed}",
                                                  headers={"Allow": allowed})
                if auth:
                    authenticate(request)
                response = view(request, *args, **kwargs)
            except errors.ApiError as exc:
                response = exc.response()
            except UnknownFlow as exc:
                response = errors.UnknownFlowError(str(exc)).response()
            except UnknownExecution as exc:
                response = errors.UnknownExecutionError(str(exc)).response()
            except FlowInvalidInput as exc:
                response = errors.InvalidInput(str(exc)).response()
            except InvalidStream as exc:
                response = errors.InvalidBody(f"execution id refused by the journal: {exc}").response()
            except Exception as exc:
                response = errors.internal_error(request, exc)
            # Every API response names the worker process that served it: the benchmark counts the
            # first request each worker serves (its cold start); an operator matches a response to a log.
            response["X-Loom-Worker"] = str(os.getpid())
            return response

        return wrapper

    return decorate


@api_view("GET", auth=False)
def health(request):
    """Liveness for load balancers and the benchmark's readiness poll: no auth, no database."""
    return JsonResponse({"status": "ok"})


@api_view("POST")
def call(request, name: str):
    """Run a flow transiently: input in, result out, nothing written; optional caller-owned state.

    A flow that raises is answered 200 with status "failed" and its error (the caller keeps its old
    state): the request was served; the flow's own failure is data, as for a durable execution.
    """
    body = call_body(read_json(request))
    flow = get_flow(name)
    outcome = invoke_transient(flow, flow_input(body))
    if outcome.status != "completed":
        return JsonResponse({"status": outcome.status, "result": None, "error": outcome.error})
    return JsonResponse({"status": "completed", **split_result(flow.name, body, outcome.result), "error": None})


@api_view("POST")
def start_execution(request, name: str):
    """Start a durable execution (runs to completion in this request); idempotent on execution_id."""
    body = start_body(read_json(request))
    flow = get_flow(name)
    try:
        outcome = start(flow, flow_input(body), execution_id=body.execution_id)
    except ExecutionExists as exc:
        if exc.flow and exc.flow != flow.name:
            raise errors.ExecutionConflict(
                f"execution {exc.execution_id!r} already exists for flow {exc.flow!r}, not {flow.name!r}") from None
        # The id is an idempotency key: a repeat must be the same request, not a new one under an old id.
        if load_state(exc.execution_id).input != flow.prepare(flow_input(body))[1]:
            raise errors.ExecutionConflict(
                f"execution {exc.execution_id!r} already exists with a different input; "
                "choose a new execution_id for a new execution") from None
        existing = {"execution_id": exc.execution_id, "flow": exc.flow or flow.name, "status": exc.status,
                    "result": exc.result, "error": exc.error or None, "created": False}
        return JsonResponse(existing, status=200, headers={"Location": _location(request, exc.execution_id)})
    created = {"execution_id": outcome.execution_id, "flow": flow.name, "status": outcome.status,
               "result": outcome.result, "error": outcome.error or None, "created": True}
    return JsonResponse(created, status=201, headers={"Location": _location(request, outcome.execution_id)})


@api_view("GET")
def execution(request, execution_id: str):
    """An execution's status, result, error and events."""
    return JsonResponse(describe(execution_id))


@api_view("GET", "POST", "PUT", "PATCH", "DELETE", auth=False)
def not_found(request, rest: str = ""):
    """Any other path under the API prefix: a JSON 404 rather than Django's HTML page."""
    raise errors.NotFound(f"no API route at {request.path!r}; see docs/http-api.md")


def _location(request, execution_id: str) -> str:
    return reverse("loomapi:execution", kwargs={"execution_id": execution_id})
