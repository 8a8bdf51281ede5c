"""Value objects of the journal: what a writer appends and what it gets back.

Validation happens here, before any SQL, so that bad input never reaches the database.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from journal import conf
from journal.exceptions import InvalidPayload, InvalidStream

TYPE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.:\-]{0,99}$")
STREAM_ID = re.compile(r"^[^\s\x00-\x1f\x7f]{1,200}$")


def check_stream_id(stream_id: str) -> str:
    if not isinstance(stream_id, str) or not STREAM_ID.match(stream_id):
        raise InvalidStream(
            f"invalid stream id {stream_id!r}: 1 to 200 characters, no whitespace or control characters"
        )
    return stream_id


@dataclass(frozen=True, slots=True)
class Envelope:
    """One event to append: a type name and a JSON-serialisable payload."""

    type: str
    payload: Any = field(default_factory=dict)

    def encode(self, max_bytes: int | None = None) -> str:
        """The payload as JSON text, after checking the type name, serialisability and size."""
        if not isinstance(self.type, str) or not TYPE_NAME.match(self.type):
            raise InvalidPayload(
                f"invalid event type {self.type!r}: a letter, then up to 99 of letters, digits, _ . : -"
            )
        try:
            text = json.dumps(self.payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise InvalidPayload(f"payload of {self.type} is not JSON-serialisable: {exc}") from None
        limit = conf.get("LOOM_MAX_PAYLOAD_BYTES") if max_bytes is None else max_bytes
        size = len(text.encode("utf-8")) if len(text) * 4 > limit else len(text)
        if size > limit:
            raise InvalidPayload(f"payload of {self.type} is {size} bytes, over LOOM_MAX_PAYLOAD_BYTES={limit}")
        if "\\u0000" in text:  # json.dumps escapes NUL; PostgreSQL's jsonb refuses \u0000
            raise InvalidPayload(f"payload of {self.type} contains a NUL character, which PostgreSQL cannot store")
        return text


def as_envelope(item: Envelope | tuple[str, Any] | dict) -> Envelope:
    """Accept an Envelope, a (type, payload) pair or a {"type":..., "payload":...} dict."""
    if isinstance(item, Envelope):
        return item
    if isinstance(item, tuple) and len(item) == 2:
        return Envelope(item[0], item[1])
    if isinstance(item, dict) and "type" in item:
        return Envelope(item["type"], item.get("payload", {}))
    raise InvalidPayload(f"not an envelope: {item!r} (use Envelope(type, payload) or a (type, payload) pair)")


@dataclass(frozen=True, slots=True)
class AppendItem:
    """The events of one stream within a batch, with that stream's guards.

    fence_token: the writer's token; the append is refused unless it is the stream's current one.
    expected_seq: the seq of the stream's last event the writer saw (-1 for an empty stream);
    the append is refused unless the tip is exactly there. Either, both or neither may be given.
    """

    stream_id: str
    envelopes: tuple[Envelope, ...]
    fence_token: int | None = None
    expected_seq: int | None = None

    @classmethod
    def build(cls, stream_id: str, envelopes, fence_token: int | None = None,
              expected_seq: int | None = None) -> AppendItem:
        check_stream_id(stream_id)
        items = tuple(as_envelope(e) for e in (envelopes if not isinstance(envelopes, Envelope) else [envelopes]))
        if not items:
            raise InvalidPayload(f"append to {stream_id} has no events")
        if fence_token is not None and (not isinstance(fence_token, int) or isinstance(fence_token, bool)
                                        or fence_token < 1):
            raise InvalidPayload(f"fence token for {stream_id} must be a positive integer, got {fence_token!r}")
        if expected_seq is not None and (not isinstance(expected_seq, int) or isinstance(expected_seq, bool)
                                         or expected_seq < -1):
            raise InvalidPayload(f"expected_seq for {stream_id} must be an integer >= -1, got {expected_seq!r}")
        return cls(stream_id, items, fence_token, expected_seq)


@dataclass(frozen=True, slots=True)
class Appended:
    """What one stream received: the seqs first..last (inclusive) are now its tail."""

    stream_id: str
    first_seq: int
    last_seq: int

    @property
    def seqs(self) -> range:
        return range(self.first_seq, self.last_seq + 1)


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """An event as read back from the log."""

    stream_id: str
    seq: int
    type: str
    payload: Any
    recorded_at: datetime
    id: int = 0

    @classmethod
    def from_row(cls, row: tuple) -> StoredEvent:
        event_id, stream_id, seq, type_, payload, recorded_at = row
        if isinstance(payload, str):
            payload = json.loads(payload)
        return cls(stream_id, seq, type_, payload, recorded_at, event_id)


@dataclass(frozen=True, slots=True)
class SnapshotRecord:
    """A checkpoint of a stream's folded state, covering events up to and including `seq`."""

    stream_id: str
    seq: int
    state: Any
