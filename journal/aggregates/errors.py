"""The errors of aggregates. Each one guarantees that nothing of the failed action was written.

They extend the journal's hierarchy, so `except JournalError` still catches everything, and
`ConcurrencyError` stays the journal's own `SequenceConflict`: a caller retries on one signal.
"""

from __future__ import annotations

from collections.abc import Sequence

from journal.exceptions import ConcurrencyError, InvalidPayload, JournalError


class AggregateError(JournalError):
    """Base class of the errors raised by event-sourced aggregates."""


class CompactedStream(AggregateError):
    """The stream was compacted (its events before seq `first_seq` were deleted, journal/compaction.py) and it
    cannot be loaded from its snapshot (the snapshot no longer fits the state's schema, the state became
    sensitive, or a replay from seq 0 was asked for): replaying only the kept events would give a wrong state."""

    def __init__(self, stream: str, first_seq: int, reason: str):
        self.stream, self.first_seq, self.reason = stream, first_seq, reason
        super().__init__(f"{stream} was compacted before seq {first_seq} and {reason}: a replay of the kept "
                         f"events alone would give a wrong state; nothing was read as its state")


class DeclarationError(AggregateError, TypeError):
    """A state, event or action is declared wrongly (raised at declaration or first use, never mid-commit)."""


class InvariantViolated(AggregateError):
    """An invariant of an action did not hold on the stream's current state; nothing was written."""

    def __init__(self, invariant: str, stream: str, action: str, version: int):
        self.invariant, self.stream, self.action, self.version = invariant, stream, action, version
        super().__init__(
            f"{action} refused on {stream} at version {version}: invariant {invariant!r} does not hold;"
            " nothing written"
        )


class InvalidActionPayload(AggregateError, InvalidPayload):
    """The input of an action does not match its schema; nothing was written."""

    def __init__(self, action: str, stream: str, errors: Sequence[dict] | str):
        self.action, self.stream, self.errors = action, stream, errors
        super().__init__(f"invalid payload for {action} on {stream}: {_describe(errors)}; nothing written")


class InvalidEventPayload(AggregateError, InvalidPayload):
    """An event an action emitted does not match its declared schema; nothing was written."""

    def __init__(self, event: str, stream: str, errors: Sequence[dict] | str):
        self.event, self.stream, self.errors = event, stream, errors
        super().__init__(f"event {event} emitted on {stream} is invalid: {_describe(errors)}; nothing written")


class UnknownEvent(AggregateError):
    """A stored event has a type its state does not declare: the stream belongs to another state."""

    def __init__(self, state: str, stream: str, seq: int, type_: str):
        self.state, self.stream, self.seq, self.type = state, stream, seq, type_
        super().__init__(f"{stream}#{seq} has type {type_!r}, which state {state} does not declare")


class RetriesExhausted(ConcurrencyError):
    """Every attempt of a retried action lost its race; the last attempt wrote nothing."""

    def __init__(self, action: str, stream: str, attempts: int):
        self.action, self.attempts = action, attempts
        super().__init__(f"{action} on {stream} lost the race {attempts} times in a row; nothing written", [stream])


def _describe(errors: Sequence[dict] | str) -> str:
    """pydantic's error list as one line: `field: message, ...`."""
    if isinstance(errors, str):
        return errors
    parts = []
    for err in errors:
        where = ".".join(str(p) for p in err.get("loc", ())) or "payload"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return ", ".join(parts)


__all__ = [
    "AggregateError",
    "ConcurrencyError",
    "DeclarationError",
    "InvalidActionPayload",
    "InvalidEventPayload",
    "InvariantViolated",
    "RetriesExhausted",
    "UnknownEvent",
]
