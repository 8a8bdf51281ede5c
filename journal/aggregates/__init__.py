"""Event-sourced aggregates on the journal: states, actions, invariants, cached loads.

Declare a `State` (a pydantic model), its events with `@state.on(Schema)` and actions with
`@state.action(Input, given=[Invariant(...)])`, then `do(action, id, payload, actor=...)` and
`load(state, id)`. See docs/aggregates.md for the full example and the guarantees.

Stream-id convention: aggregate `id` of state `S` lives in the journal stream `S.prefix + id`
(default prefix `"<state name>-"`), so the admin finds a state's streams by prefix.
"""

from journal.aggregates.cache import StateCache, cache
from journal.aggregates.declarations import Action, Actor, EventType, Invariant, State, invariant, states
from journal.aggregates.errors import (
    AggregateError,
    CompactedStream,
    ConcurrencyError,
    DeclarationError,
    InvalidActionPayload,
    InvalidEventPayload,
    InvariantViolated,
    RetriesExhausted,
    UnknownEvent,
)
from journal.aggregates.runtime import META, Aggregate, Committed, do, do_with_retry, load, replay

__all__ = [
    "META",
    "Action",
    "Actor",
    "Aggregate",
    "AggregateError",
    "Committed",
    "CompactedStream",
    "ConcurrencyError",
    "DeclarationError",
    "EventType",
    "InvalidActionPayload",
    "InvalidEventPayload",
    "Invariant",
    "InvariantViolated",
    "RetriesExhausted",
    "State",
    "StateCache",
    "UnknownEvent",
    "cache",
    "do",
    "do_with_retry",
    "invariant",
    "load",
    "replay",
    "states",
]
