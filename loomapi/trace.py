"""Trace context of API requests: a W3C `traceparent` taken from the request or minted.

Every API request gets a trace id (32 hex digits) and a span id of its own (16 hex digits). The
trace id comes from a valid incoming `traceparent` header (so a caller's trace continues through
the API) or is minted; the response carries `traceparent` with our span. While the request runs,
the ids are in a context variable: `TraceLogFilter` adds them to every log record (`%(trace_id)s`),
and a durable start records them in its EXECUTION_STARTED event under `$meta`
(`{"trace_id": ..., "span_id": ..., "started_by": ...}`).
"""

from __future__ import annotations

import contextvars
import logging
import re
import secrets
from dataclasses import dataclass

from journal import telemetry

_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


@dataclass(frozen=True, slots=True)
class Trace:
    trace_id: str
    span_id: str
    parent_id: str | None = None
    flags: str = "01"

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{self.flags}"


_current: contextvars.ContextVar[Trace | None] = contextvars.ContextVar("loomapi_trace", default=None)


def from_header(value: str | None) -> Trace:
    """The request's trace: continue a valid `traceparent` (version 00 rules), or mint a new one."""
    if value:
        match = _TRACEPARENT.fullmatch(value.strip().lower())
        if match:
            version, trace_id, parent_id, flags = match.groups()
            if version != "ff" and trace_id != "0" * 32 and parent_id != "0" * 16:
                return Trace(trace_id, secrets.token_hex(8), parent_id, flags)
    return Trace(secrets.token_hex(16), secrets.token_hex(8))


def begin(value: str | None, method: str = "", route: str = "") -> tuple[Trace, contextvars.Token]:
    trace = from_header(value)
    ids = telemetry.request_begin(trace.trace_id, trace.parent_id, method, route)  # None: tracing is off
    if ids is not None:  # the request's OTel span: its ids are the ones answered and recorded in $meta
        trace = Trace(ids[0], ids[1], trace.parent_id, trace.flags)
    return trace, _current.set(trace)


def end(token: contextvars.Token) -> None:
    _current.reset(token)


def current() -> Trace | None:
    return _current.get()


class TraceLogFilter(logging.Filter):
    """Adds `trace_id` and `span_id` to every record ("-" outside an API request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        trace = _current.get()
        record.trace_id = trace.trace_id if trace else "-"
        record.span_id = trace.span_id if trace else "-"
        return True
