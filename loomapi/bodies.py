"""Reading and validating request bodies: size limit, JSON, and the shape of each endpoint's body.

Bodies are small JSON objects, checked by hand rather than through a model: the checks are few,
the messages name the offending key, and the hot path of a transient call stays cheap.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from journal import conf
from loomapi.errors import InvalidBody, MalformedJson, PayloadTooLarge, UnsupportedMediaType

_NO_STATE = object()
# Execution ids become journal stream ids: printable, no whitespace, bounded.
_EXECUTION_ID = re.compile(r"^[^\s\x00-\x1f\x7f]{1,200}$")


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
    """A durable start: a call body plus an optional caller-chosen execution id (idempotency key)."""

    execution_id: str | None = None


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
    raw = request.read(limit + 1)
    if len(raw) > limit:
        raise PayloadTooLarge(f"request body exceeds LOOM_API_MAX_BODY_BYTES={limit}")
    if not raw:
        raise MalformedJson("request body is empty; send a JSON object")
    try:
        return json.loads(raw)
    except UnicodeDecodeError:
        raise MalformedJson("request body is not UTF-8") from None
    except ValueError as exc:
        raise MalformedJson(f"request body is not valid JSON: {exc}") from None


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
    data = _object(data, {"input", "state", "execution_id"})
    execution_id = data.get("execution_id")
    if execution_id is not None and (not isinstance(execution_id, str) or not _EXECUTION_ID.match(execution_id)):
        raise InvalidBody("'execution_id' must be a string of 1 to 200 printable characters without whitespace")
    return StartBody(data["input"], data.get("state", _NO_STATE), execution_id)
