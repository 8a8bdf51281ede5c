"""The API's errors: each one is an HTTP status, a stable code and a message, rendered as JSON.

Every error response has the same body, so a client handles one shape:

    {"error": {"code": "unknown_flow", "message": "no flow is registered as 'x' ...", "id": null}}

`id` is set only on 500s and 504s: the same id is logged server-side (with the traceback of a 500,
which never reaches the client; with the flow and trace id of a call that timed out, for a 504).
"""

from __future__ import annotations

import logging
import uuid

from django.http import JsonResponse

logger = logging.getLogger("loomapi")


class ApiError(Exception):
    """A request the API refuses; subclasses fix the status and code."""

    status = 400
    code = "bad_request"

    def __init__(self, message: str, *, headers: dict[str, str] | None = None):
        self.message = message
        self.headers = headers or {}
        super().__init__(message)

    def response(self) -> JsonResponse:
        return error_response(self.status, self.code, self.message, headers=self.headers)


class MalformedJson(ApiError):
    """The body is not valid UTF-8 JSON."""

    code = "malformed_json"


class InvalidBody(ApiError):
    """The JSON body does not have the shape the endpoint documents (unknown keys, wrong types)."""

    code = "invalid_body"


class InvalidParameter(ApiError):
    """A query parameter has a value the endpoint does not take."""

    code = "invalid_parameter"


class Unauthorized(ApiError):
    """No bearer token, or one the server does not accept."""

    status = 401
    code = "unauthorized"


class NotFound(ApiError):
    """No such route, flow or execution."""

    status = 404
    code = "not_found"


class UnknownFlowError(NotFound):
    """No flow is registered under that name, or none this token may use (the same answer: loomapi/auth.py)."""

    code = "unknown_flow"


class UnknownExecutionError(NotFound):
    code = "unknown_execution"


class MethodNotAllowed(ApiError):
    status = 405
    code = "method_not_allowed"


class ExecutionConflict(ApiError):
    """The caller-chosen execution id already names an execution of another flow."""

    status = 409
    code = "execution_conflict"


class ExecutionFinished(ApiError):
    """A message to an execution that has settled (completed, failed or cancelled): nobody would
    ever receive it, so it is refused and nothing is written."""

    status = 409
    code = "execution_finished"


class PayloadTooLarge(ApiError):
    status = 413
    code = "payload_too_large"


class UnsupportedMediaType(ApiError):
    status = 415
    code = "unsupported_media_type"


class CallTimedOut(ApiError):
    """A transient call ran past LOOM_API_CALL_TIMEOUT; the worker that ran it retires."""

    status = 504
    code = "call_timeout"

    def __init__(self, message: str, *, call_id: str):
        self.call_id = call_id
        super().__init__(message, headers={"Connection": "close"})

    def response(self) -> JsonResponse:
        return error_response(self.status, self.code, self.message, error_id=self.call_id, headers=self.headers)


class DatabaseUnavailable(ApiError):
    """The database could not be reached (a restart, a failover to the standby: docs/scaling.md "High
    availability"). Retryable: the request's effect is in doubt only for a write whose commit was in flight, and
    a retry of a start with the same execution id is answered as a repeat of it, never run twice."""

    status = 503
    code = "database_unavailable"
    RETRY_AFTER = "1"

    def __init__(self, message: str):
        super().__init__(message, headers={"Retry-After": self.RETRY_AFTER})


class InvalidInput(ApiError):
    """The flow's input (or caller-owned state) does not validate; nothing was run or written."""

    status = 422
    code = "invalid_input"


def error_response(status: int, code: str, message: str, *, error_id: str | None = None,
                   headers: dict[str, str] | None = None) -> JsonResponse:
    response = JsonResponse({"error": {"code": code, "message": message, "id": error_id}}, status=status)
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def internal_error(request, exc: BaseException) -> JsonResponse:
    """A 500 whose body carries only an id; the traceback goes to the log under that id."""
    error_id = uuid.uuid4().hex
    logger.error("internal error %s on %s %s", error_id, request.method, request.path,
                 exc_info=(type(exc), exc, exc.__traceback__))
    return error_response(500, "internal_error", f"internal server error; quote id {error_id} to the operator",
                          error_id=error_id)
