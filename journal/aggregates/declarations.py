"""Declaring an aggregate: its state, the events that patch it, the actions that emit them.

    class Ticket(BaseModel):                     # the state: a pydantic model, defaults = initial
        status: str = "new"
        assignee: str | None = None

    ticket = State("Ticket", Ticket, snapshot_every=100)

    @ticket.on(TicketOpened)                     # an event: its payload schema and its patch
    def _(state: Ticket, e: TicketOpened) -> dict:
        return {"status": "open"}

    is_open = Invariant("ticket is open", lambda s: s.status == "open")

    @ticket.action(AssignTicket, given=[is_open])  # an action: input schema, invariants, handler
    def assign(state: Ticket, cmd: AssignTicket, actor) -> TicketAssigned:
        return TicketAssigned(to=cmd.to)

Everything here is data; journal/aggregates/runtime.py does the loading and committing.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from journal import conf
from journal.aggregates import versioning
from journal.aggregates.errors import DeclarationError
from journal.envelopes import TYPE_NAME
from journal.privacy import marking

S = TypeVar("S", bound=BaseModel)
C = TypeVar("C", bound=BaseModel)

Actor = str | Mapping[str, Any] | None
"""Who runs an action: a name, a JSON object ({"id": ..., "name": ...}) or None. Recorded with each event."""

Patch = Callable[[Any, Any], "Mapping[str, Any] | BaseModel | None"]
"""(state, event) -> the fields that change (a dict), or a whole new state, or None for no change."""


def _arity(fn: Callable, most: int) -> int:
    """How many leading positional arguments `fn` takes (capped at `most`), so handlers may omit `actor`."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return most
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return most
    return min(most, sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params))


@dataclass(frozen=True)
class Invariant:
    """A rule that must hold on the current state before an action runs: `check(state[, actor]) -> bool`."""

    description: str
    check: Callable[..., bool]
    takes_actor: bool = field(init=False)

    def __post_init__(self) -> None:
        if not self.description:
            raise DeclarationError("an invariant needs a description: it is what a refusal names")
        object.__setattr__(self, "takes_actor", _arity(self.check, 2) >= 2)

    def holds(self, state: Any, actor: Actor) -> bool:
        return bool(self.check(state, actor) if self.takes_actor else self.check(state))


def invariant(description: str) -> Callable[[Callable[..., bool]], Invariant]:
    """Decorator form: `@invariant("stock is positive")` over `def in_stock(state) -> bool`."""
    return lambda check: Invariant(description, check)


@dataclass(frozen=True)
class EventType:
    """One declared event name: its payload schema and either a patch or an upcaster (old versions)."""

    name: str
    schema: type[BaseModel]
    patch: Patch | None = None
    upcast: Callable[[dict], dict] | None = None


@dataclass(frozen=True)
class Action(Generic[S, C]):
    """An action of a state: validated input, invariants checked first, a handler that returns events."""

    state: State[S]
    name: str
    schema: type[C]
    handler: Callable[..., Any]
    given: tuple[Invariant, ...] = ()
    takes_actor: bool = True

    def __repr__(self) -> str:
        return f"<Action {self.state.name}.{self.name}>"


class State(Generic[S]):
    """An event-sourced state: a pydantic model, the events that patch it and the actions on it.

    name: unique in the process; the default stream prefix is `"<name>-"`, so aggregate `42` of
    state `Ticket` is the journal stream `Ticket-42`. Pass `prefix=` to choose another.
    snapshot_every: after a commit that brings the events since the last snapshot to this many,
    the runtime checkpoints the state (journal_snapshot), so a cold load replays at most that many.
    compact: the retention service deletes the events before each stream's newest snapshot
    (journal/compaction.py; LOOM_COMPACT_AGGREGATES does the same from settings). Needs snapshot_every.
    """

    def __init__(self, name: str, schema: type[S], *, initial: S | None = None, prefix: str | None = None,
                 snapshot_every: int | None = None, compact: bool = False):
        if not (isinstance(schema, type) and issubclass(schema, BaseModel)):
            raise DeclarationError(f"state {name}: schema must be a pydantic BaseModel subclass, got {schema!r}")
        if snapshot_every is not None and snapshot_every < 1:
            raise DeclarationError(f"state {name}: snapshot_every must be a positive integer or None")
        if not isinstance(compact, bool):
            raise DeclarationError(f"state {name}: compact must be True or False, got {compact!r}")
        if compact and snapshot_every is None:
            raise DeclarationError(f"state {name}: compact=True needs snapshot_every (compaction keeps the events "
                                   "after the newest snapshot)")
        self.name = name
        self.schema = schema
        self.initial: S = initial if initial is not None else schema()
        self.prefix = f"{name}-" if prefix is None else prefix
        self.snapshot_every = snapshot_every
        self.compact = compact
        self.events: dict[str, EventType] = {}
        self.actions: dict[str, Action[S, Any]] = {}
        self._names_by_class: dict[type, str] = {}
        self.deprecated: frozenset[str] = frozenset()
        self.successor: dict[str, str] = {}
        self._checked = False
        self._schema_marked = bool(marking.fields_of_model(schema))
        self._sensitive: tuple[frozenset[str] | None, bool] = (None, False)
        register(self)

    def __repr__(self) -> str:
        return f"<State {self.name}>"

    @property
    def sensitive(self) -> bool:
        """Whether the state holds personal data: its schema has marks, or one of its event types is marked (on
        its schema, or by declare(), maybe after this state was built). Such a state is never snapshotted nor
        cached in memory (docs/privacy.md): a checkpoint would keep in clear what the log keeps sealed, and
        outlive a forget. Decided at use, again whenever the registry of marked types changed."""
        marked = marking.MARKED
        seen, sensitive = self._sensitive
        if seen is not marked:
            sensitive = self._schema_marked or not marked.isdisjoint(self.events)
            self._sensitive = (marked, sensitive)
        return sensitive

    def stream(self, id: str) -> str:
        """The journal stream id of aggregate `id`."""
        return f"{self.prefix}{id}"

    # -- declaring ---------------------------------------------------------------------------------
    def on(self, schema: type[BaseModel], *, name: str | None = None) -> Callable[[Patch], Patch]:
        """Declare an event and how it patches the state: `@state.on(Opened)` over `def _(state, e)`."""
        event_name = self._event_name(schema, name)

        def decorate(patch: Patch) -> Patch:
            self._add(EventType(event_name, schema, patch=patch))
            return patch

        return decorate

    def upcast(self, schema: type[BaseModel], *, name: str | None = None) -> Callable[[Callable], Callable]:
        """Declare an OLD version of an event, read by turning its payload into the next version's.

        `@state.upcast(OpenedV1, name="Opened")` over `def _(payload: dict) -> dict` returning a
        payload of `Opened_v2` (the next declared version). Chains are followed to the newest.
        """
        event_name = self._event_name(schema, name)

        def decorate(fn: Callable[[dict], dict]) -> Callable[[dict], dict]:
            self._add(EventType(event_name, schema, upcast=fn))
            return fn

        return decorate

    def action(self, schema: type[C], *, name: str | None = None,
               given: Iterable[Invariant] = ()) -> Callable[[Callable[..., Any]], Action[S, C]]:
        """Declare an action: `@state.action(Assign, given=[is_open])` over `def _(state, cmd[, actor])`.

        The handler returns the events to commit: an event model, a `(name, payload)` pair, a
        list of those, or None (nothing to commit). The decorator returns the `Action` to `do()`.
        """
        if not (isinstance(schema, type) and issubclass(schema, BaseModel)):
            raise DeclarationError(f"action of {self.name}: schema must be a pydantic BaseModel subclass")
        action_name = name or schema.__name__
        rules = tuple(given)
        for rule in rules:
            if not isinstance(rule, Invariant):
                raise DeclarationError(f"action {action_name}: given= takes Invariant objects, got {rule!r}")

        def decorate(handler: Callable[..., Any]) -> Action[S, C]:
            if action_name in self.actions:
                raise DeclarationError(f"state {self.name} already has an action {action_name}")
            declared = Action(self, action_name, schema, handler, rules, _arity(handler, 3) >= 3)
            self.actions[action_name] = declared
            return declared

        return decorate

    def _event_name(self, schema: type[BaseModel], name: str | None) -> str:
        if not (isinstance(schema, type) and issubclass(schema, BaseModel)):
            raise DeclarationError(f"event of {self.name}: schema must be a pydantic BaseModel subclass")
        event_name = name or schema.__name__
        if not TYPE_NAME.match(event_name):
            raise DeclarationError(f"event name {event_name!r} of {self.name} is not a valid journal type name")
        return event_name

    def _add(self, event: EventType) -> None:
        if event.name in self.events:
            raise DeclarationError(f"state {self.name} already declares event {event.name}")
        self.events[event.name] = event
        # Marked fields (journal/privacy) of the payload schema are sealed on every append of this type.
        marking.declare_model(event.name, event.schema)
        self._sensitive = (None, False)  # decided again at the next use
        # A schema class used under one name is emitted by returning an instance of it; a class
        # shared by several names must be emitted as a (name, payload) pair.
        self._names_by_class[event.schema] = "" if event.schema in self._names_by_class else event.name
        self.deprecated, self.successor = versioning.plan(self.events)
        self._checked = False

    # -- used by the runtime -------------------------------------------------------------------------
    def name_of(self, event_class: type) -> str | None:
        """The event name an instance of this class is emitted as ("" when ambiguous, None if undeclared)."""
        return self._names_by_class.get(event_class)

    def check(self) -> None:
        """Verify the declarations hang together; run once before first use."""
        if self._checked:
            return
        # An old version may keep its own patch (read as it is) or declare an upcaster, which
        # needs a newer version to upcast to.
        for event in self.events.values():
            if event.patch is None and event.name not in self.successor:
                raise DeclarationError(
                    f"{self.name}.{event.name} has an upcaster but no newer version (name it <base>_v<N+1>)"
                )
        self._checked = True


# -- the registry: which states exist, for the admin and the stream-id convention ---------------------
_states: dict[str, State] = {}


def register(state: State) -> None:
    existing = _states.get(state.name)
    if existing is not None and existing is not state:
        raise DeclarationError(f"a state named {state.name} is already declared ({existing!r}); names are unique")
    _states[state.name] = state


def states() -> dict[str, State]:
    """Every declared state, after importing LOOM_AGGREGATE_MODULES (so the admin sees them all)."""
    for module in conf.get("LOOM_AGGREGATE_MODULES"):
        importlib.import_module(module)
    return dict(_states)
