"""Value objects of the journal: what a writer appends and what it gets back.

Validation happens here, before any SQL, so that bad input never reaches the database.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from journal import conf, jsonvalues
from journal.exceptions import InvalidGuard, InvalidPayload
from journal.ids import check_id, check_stored_id

TYPE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.:\-]{0,99}\Z")
"""An event type: a letter, then up to 99 letters, digits, `_ . : -`. `\\Z`, not `$`, which would let a
trailing newline through when used with match()."""

_GOOD_TYPES: set[str] = set()
"""Event types already found valid (a writer appends a few types many times: a set test instead of the regex)."""


def _good_type(name: object) -> bool:
    """Whether `name` is a valid event type (TYPE_NAME); a valid one is remembered (at most 4,096 of them)."""
    if not isinstance(name, str) or not TYPE_NAME.fullmatch(name):
        return False
    if type(name) is not str:  # a str subclass: checked, not remembered (its equality is its own)
        return True
    if len(_GOOD_TYPES) >= 4096:
        _GOOD_TYPES.clear()
    _GOOD_TYPES.add(name)
    return True


MAX_BIGINT = 2**63 - 1
"""Fence tokens and seqs are bigint columns: a guard beyond this cannot match anything stored."""


def check_stream_id(stream_id: str) -> str:
    """The stream id if the database can hold it (reads, operations on existing streams: an id stored
    before the alphabet stays usable); InvalidStream otherwise. journal/ids.py says where each rule applies."""
    return check_stored_id(stream_id, "stream id")


def check_new_stream_id(stream_id: str) -> str:
    """The stream id if it is in the id alphabet (journal/ids.py): the check where a stream is created."""
    return check_id(stream_id, "stream id")


def check_token(token: object, what: str, stream_id: str, minimum: int = 1) -> None:
    """A fence token or seq given as a guard: None, or an int (not bool) in minimum..2**63-1."""
    if token is not None and (type(token) is not int or not minimum <= token <= MAX_BIGINT):
        raise InvalidGuard(f"{what} for {stream_id} must be an integer from {minimum} to 2**63-1, got {token!r}")


@dataclass(frozen=True, slots=True)
class Envelope:
    """One event to append: a type name and a JSON-serialisable payload."""

    type: str
    payload: Any = field(default_factory=dict)

    def encode(self, max_bytes: int | None = None) -> str:
        """The payload as JSON text, after checking the type name, serialisability and size."""
        name = self.type
        if not (type(name) is str and name in _GOOD_TYPES) and not _good_type(name):
            raise InvalidPayload(
                f"invalid event type {self.type!r}: a letter, then up to 99 of letters, digits, _ . : -"
            )
        text = jsonvalues.dumps(self.payload, f"payload of {self.type}")
        limit = conf.get("LOOM_MAX_PAYLOAD_BYTES") if max_bytes is None else max_bytes
        size = len(text.encode("utf-8")) if len(text) * 4 > limit else len(text)
        if size > limit:
            raise InvalidPayload(f"payload of {self.type} is {size} bytes, over LOOM_MAX_PAYLOAD_BYTES={limit}")
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

    def __post_init__(self) -> None:
        # Checked here, not only in build(): append_batch() takes AppendItem(...) made directly too.
        # An append that may create its stream (no fence token, no expected_seq >= 0: nothing refuses it on
        # a stream that does not exist) checks the id alphabet; a guarded one only needs a storable id, so
        # streams stored before the alphabet existed can still be written by their owners.
        if self.fence_token is None and (self.expected_seq is None or self.expected_seq == -1):
            check_new_stream_id(self.stream_id)
        else:
            check_stream_id(self.stream_id)
        envelopes = self.envelopes
        if type(envelopes) is Envelope:  # the common spelling, one event: no generator, no as_envelope
            object.__setattr__(self, "envelopes", (envelopes,))
        elif type(envelopes) is not tuple or not all(type(e) is Envelope for e in envelopes):
            if isinstance(envelopes, (str, bytes)) or not hasattr(envelopes, "__iter__"):
                envelopes = [envelopes]
            object.__setattr__(self, "envelopes", tuple(as_envelope(e) for e in envelopes))
        if not self.envelopes:
            raise InvalidPayload(f"append to {self.stream_id} has no events")
        check_token(self.fence_token, "fence token", self.stream_id)
        check_token(self.expected_seq, "expected_seq", self.stream_id, minimum=-1)

    @classmethod
    def build(cls, stream_id: str, envelopes, fence_token: int | None = None,
              expected_seq: int | None = None) -> AppendItem:
        """An item from any accepted spelling of envelopes (one Envelope, pairs, dicts); validated."""
        return cls(stream_id, envelopes, fence_token, expected_seq)


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
