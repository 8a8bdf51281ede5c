"""Reading and validating request bodies: size limit, JSON, and the shape of each endpoint's body.

Bodies are small JSON objects, checked by hand rather than through a model: the checks are few,
the messages name the offending key, and the hot path of a transient call stays cheap.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from journal import conf, jsonvalues
from journal.ids import id_problem
from loomapi.errors import InvalidBody, InvalidParameter, MalformedJson, PayloadTooLarge, UnsupportedMediaType

_NO_STATE = object()


@dataclass(frozen=True, slots=True)
class CallBody:
    """A transient call: the flow's input and, optionally, the caller-owned state."""

    input: Any
    state: Any = _NO_STATE

    @property
    def has_state(self) -> bool:
        return self.state is not _NO_STATE


@dataclass(frozen=True, slots=True)
class StartBody(CallBody):
    """A durable start: a call body plus an optional caller-chosen execution id (idempotency key) and the
    queue options every door of a start takes (queues.enqueue: queue, partition_key, priority, dedup_id,
    delay or start_at, timeout)."""

    execution_id: str | None = None
    queue: str = "default"
    partition_key: str | None = None
    priority: int = 0
    dedup_id: str | None = None
    delay: float | None = None
    start_at: Any = None  # an aware datetime
    timeout: float | None = None


QUEUE_KEYS = {"queue", "partition_key", "priority", "dedup_id", "delay", "start_at", "timeout"}


def has_body(request) -> bool:
    """The request declares a body (a Content-Length above 0, or chunked transfer coding)."""
    declared = request.META.get("CONTENT_LENGTH") or ""
    return (declared.isdigit() and int(declared) > 0) or _chunked(request)


def body_consumed(request) -> bool:
    """read_json read the whole body: nothing of it is left on the connection."""
    return getattr(request, "_loom_body_read", False)


def _chunked(request) -> bool:
    return "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", "").lower()


def _read_raw(request, limit: int) -> bytes:
    """The body, at most limit + 1 bytes of it (one byte past the limit tells an oversize body)."""
    if _chunked(request) and not request.META.get("CONTENT_LENGTH"):
        # Django reads a body of Content-Length bytes only (none: empty). A chunked body is read from
        # the WSGI stream, which the server (gunicorn) de-chunks and ends (wsgi.input_terminated).
        stream = request.META.get("wsgi.input")
        if stream is None or not request.META.get("wsgi.input_terminated"):
            raise MalformedJson("a chunked request body needs a server that terminates wsgi.input; "
                                "send Content-Length")
        parts, size = [], 0
        while size <= limit:
            part = stream.read(limit + 1 - size)
            if not part:
                break
            parts.append(part)
            size += len(part)
        return b"".join(parts)
    return request.read(limit + 1)


def _refuse_constant(name: str) -> Any:
    raise MalformedJson(f"request body is not valid JSON: {name} is not a JSON number")


def read_json(request) -> Any:
    """The request's JSON body; 415/413/400 with a JSON error when it is not one we accept."""
    content_type = request.content_type or ""
    if content_type != "application/json":
        raise UnsupportedMediaType(f"Content-Type must be application/json, got {content_type or 'none'!r}")
    limit = conf.get("LOOM_API_MAX_BODY_BYTES")
    declared = request.META.get("CONTENT_LENGTH") or ""
    if declared.isdigit() and int(declared) > limit:
        # Refused on the declared length, before reading a byte of it.
        raise PayloadTooLarge(f"request body of {declared} bytes exceeds LOOM_API_MAX_BODY_BYTES={limit}")
    # Read one byte past the limit: a body without (or with a lying) Content-Length is still bounded.
    raw = _read_raw(request, limit)
    if len(raw) > limit:
        raise PayloadTooLarge(f"request body exceeds LOOM_API_MAX_BODY_BYTES={limit}")
    request._loom_body_read = True
    if not raw:
        raise MalformedJson("request body is empty; send a JSON object")
    try:
        data = json.loads(raw, parse_constant=_refuse_constant)
    except UnicodeDecodeError:
        raise MalformedJson("request body is not UTF-8") from None
    except RecursionError:
        raise MalformedJson("request body is not valid JSON we accept: nested too deeply") from None
    except ValueError as exc:
        raise MalformedJson(f"request body is not valid JSON: {exc}") from None
    if b"\\u" in raw:
        # Only an escape can put NUL or a lone surrogate into a parsed string (raw control
        # characters and invalid UTF-8 are refused by the parser): the scan runs only then.
        problem = jsonvalues.problem(data, "request body")
        if problem is not None:
            raise InvalidBody(problem)
    return data


def _object(data: Any, allowed: set[str]) -> dict:
    if not isinstance(data, dict):
        raise InvalidBody(f"body must be a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise InvalidBody(f"unknown key(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(sorted(allowed))}")
    if "input" not in data:
        raise InvalidBody("body must carry the flow's input under 'input'")
    if "state" in data and not isinstance(data["state"], dict):
        raise InvalidBody(f"'state' must be a JSON object, got {type(data['state']).__name__}")
    return data


def call_body(data: Any) -> CallBody:
    data = _object(data, {"input", "state"})
    return CallBody(data["input"], data.get("state", _NO_STATE))


def start_body(data: Any) -> StartBody:
    data = _object(data, {"input", "state", "execution_id", *QUEUE_KEYS})
    execution_id = data.get("execution_id")
    if execution_id is not None:
        problem = id_problem(execution_id)
        if problem is not None:
            raise InvalidBody(f"'execution_id' {ascii(execution_id)[:80]} is refused: {problem}")
    names = {key: _option_name(data, key) for key in ("queue", "partition_key", "dedup_id")}
    priority = data.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidBody(f"'priority' is a whole number from -100 to 100, got {ascii(priority)[:40]}")
    delay, timeout = _number(data, "delay"), _number(data, "timeout")
    start_at = data.get("start_at")
    if start_at is not None:
        start_at = _moment(start_at)
    if delay is not None and start_at is not None:
        raise InvalidBody("give 'delay' or 'start_at', not both")
    return StartBody(data["input"], data.get("state", _NO_STATE), execution_id, names["queue"] or "default",
                     names["partition_key"], priority, names["dedup_id"], delay, start_at, timeout)


def _option_name(data: dict, key: str) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    problem = id_problem(value) if isinstance(value, str) else f"a {key} is a string"
    if problem is not None:
        raise InvalidBody(f"{key!r} {ascii(value)[:80]} is refused: {problem}")
    return value


def _number(data: dict, key: str) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 10 ** 9:
        raise InvalidBody(f"{key!r} is a number of seconds from 0, got {ascii(value)[:40]}")
    return float(value)


def _moment(value: Any):
    from datetime import datetime

    try:
        moment = datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise InvalidBody(f"'start_at' is an ISO 8601 time with its offset, got {ascii(value)[:60]}")
    return moment


def wait_seconds(request) -> float:
    """The `wait` query parameter of a durable start: seconds to wait for the outcome (0: none),
    bounded by LOOM_API_MAX_WAIT."""
    return _seconds_parameter(request, "wait")


def _seconds_parameter(request, name: str) -> float:
    """A query parameter of seconds from 0 to LOOM_API_MAX_WAIT (absent: 0); anything else InvalidParameter."""
    text = request.GET.get(name, "")
    if not text:
        return 0.0
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    limit = conf.get("LOOM_API_MAX_WAIT")
    if not 0 <= value <= limit:  # also refuses nan
        raise InvalidParameter(f"'{name}' is a number of seconds from 0 to LOOM_API_MAX_WAIT={limit:g}, "
                               f"got {text[:40]!r}")
    return value


@dataclass(frozen=True, slots=True)
class MessageBody:
    """A message to a waiting (or running, or suspended) execution: `topic`, JSON `payload`, and an
    optional caller-chosen `message_id`, the idempotency key of the send."""

    topic: str
    payload: Any
    message_id: str | None = None


_NAME_LIMIT = 200


def _name(data: dict, key: str, required: bool) -> str | None:
    value = data.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value or len(value) > _NAME_LIMIT:
        raise InvalidBody(f"{key!r} must be a non-empty string of at most {_NAME_LIMIT} characters, "
                          f"got {ascii(value)[:80]}")
    return value


def message_body(data: Any) -> MessageBody:
    """{"topic": str, "payload": any JSON, "message_id": str (optional)}; 400 invalid_body otherwise."""
    if not isinstance(data, dict):
        raise InvalidBody(f"body must be a JSON object, got {type(data).__name__}")
    allowed = {"topic", "payload", "message_id"}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise InvalidBody(f"unknown key(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(sorted(allowed))}")
    if "payload" not in data:
        raise InvalidBody("body must carry the message under 'payload' (null is a payload)")
    topic = _name(data, "topic", required=True)
    message_id = _name(data, "message_id", required=False)
    if message_id is not None and (problem := id_problem(message_id)) is not None:
        raise InvalidBody(f"'message_id' {ascii(message_id)[:80]} is refused: {problem}")
    return MessageBody(topic, data["payload"], message_id)


def cancel_reason(request) -> str:
    """A cancel's reason: the optional body `{"reason": "..."}` (no body: a reason naming the API)."""
    if not has_body(request):
        request._loom_body_read = True
        return ""
    data = read_json(request)
    if not isinstance(data, dict):
        raise InvalidBody(f"body must be a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - {"reason"})
    if unknown:
        raise InvalidBody(f"unknown key(s) {', '.join(map(repr, unknown))}; allowed: 'reason'")
    reason = data.get("reason", "")
    if not isinstance(reason, str) or len(reason) > 2000:
        raise InvalidBody("'reason' is a string of at most 2000 characters")
    return reason


def timeout_seconds(request) -> float:
    """The `timeout` query parameter of an event read: seconds to wait for the event (0: none),
    bounded by LOOM_API_MAX_WAIT like a start's `wait`."""
    return _seconds_parameter(request, "timeout")
