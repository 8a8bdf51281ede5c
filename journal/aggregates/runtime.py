"""Loading and committing aggregates: `load`, `do`, `do_with_retry`.

    agg = do(assign, "42", {"to": "ann"}, actor="bob")     # -> Aggregate(state=..., version=...)
    agg = load(ticket, "42")                               # cached: no query after our own commit

`do` loads the state (cache, else newest snapshot + tail), checks the action's invariants,
runs its handler, folds the emitted events into the state in memory (so a failing patch writes
nothing), and appends them with `expected_seq` = the version it loaded. If another writer got
there first the journal refuses the whole append with `ConcurrencyError`; the cache entry is
marked stale and `do_with_retry` re-loads and re-runs a bounded number of times.
"""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from django.db import DatabaseError, transaction
from pydantic import BaseModel, ValidationError

from journal import shards
from journal.aggregates import versioning
from journal.aggregates.cache import cache
from journal.aggregates.declarations import Action, Actor, EventType, State
from journal.aggregates.errors import (
    CompactedStream,
    ConcurrencyError,
    DeclarationError,
    InvalidActionPayload,
    InvalidEventPayload,
    InvariantViolated,
    RetriesExhausted,
    UnknownEvent,
)
from journal.atomic import atomic
from journal.envelopes import Envelope, StoredEvent
from journal.exceptions import ForgottenData
from journal.ids import check_stored_id
from journal.models import Event, Snapshot
from journal.privacy import marking
from journal.privacy.codec import FORGOTTEN
from journal.store import store_for

logger = logging.getLogger("journal.aggregates")

S = TypeVar("S", bound=BaseModel)

META = "$meta"
"""Payload key under which `do` records the action and actor of each event ({"action":..., "actor":...}).
No pydantic field can be named `$meta`, so it never collides with an event's own fields; it is
removed before an event is validated or patched."""


@dataclass(frozen=True, slots=True)
class Committed:
    """One event an action committed: its seq in the stream, its type and its stored payload."""

    seq: int
    type: str
    payload: dict


@dataclass(frozen=True, slots=True)
class Aggregate(Generic[S]):
    """An aggregate as of `version` (the seq of its last event; -1 for a stream with no events).

    `committed` holds the events of the `do` call that returned it (empty after `load`).
    `since_snapshot` counts the events after the newest snapshot, for the snapshot policy.
    """

    kind: str
    id: str
    stream: str
    state: S
    version: int
    since_snapshot: int = 0
    committed: tuple[Committed, ...] = ()


# -- folding ------------------------------------------------------------------------------------------
def _merge(current: BaseModel, change: Any) -> BaseModel:
    if change is None:
        return current
    if isinstance(change, BaseModel):
        return change
    if isinstance(change, Mapping):
        return current.model_copy(update=change)
    raise DeclarationError(f"a patch must return a dict of changed fields, a state or None, not {change!r}")


def _apply_stored(st: State, current: BaseModel, stream: str, seq: int, type_: str, payload: Any) -> BaseModel:
    """Patch `current` with one stored event, upcasting an old version to the newest first."""
    event = st.events.get(type_)
    if event is None:
        raise UnknownEvent(st.name, stream, seq, type_)
    if isinstance(payload, dict) and META in payload:
        payload = {k: v for k, v in payload.items() if k != META}
    if st.sensitive and type_ in marking.MARKED:
        for f in marking.fields_for(type_, payload):
            if f.forgotten == "error" and marking.get(payload, f.path) == FORGOTTEN:
                raise ForgottenData(f"{stream}#{seq}: field {'.'.join(f.path)} of {type_} belongs to a forgotten "
                                    f"subject, and {st.name} declares Sensitive(forgotten='error')")
    while event.patch is None:  # only old versions declared with an upcaster have no patch
        assert event.upcast is not None
        payload = event.upcast(payload)
        event = st.events[st.successor[event.name]]
    try:
        model = event.schema.model_validate(payload)
    except ValidationError as exc:
        raise InvalidEventPayload(event.name, f"{stream}#{seq}", exc.errors(include_url=False)) from None
    return _merge(current, event.patch(current, model))


class _Gap(Exception):
    """A read after seq `after` began later than after + 1: the stream was compacted past `after` meanwhile."""


def _fold(st: State, current: BaseModel, stream: str, events: Iterable[StoredEvent],
          after: int | None = None) -> tuple[BaseModel, int, int]:
    """(state, last seq, count) after applying `events` in order. With `after`, the events must follow it
    without a gap (`_Gap` otherwise): a compaction may have deleted events between a snapshot read and the
    events read after it (two statements), and folding what is left would give a wrong state."""
    count, last = 0, None
    for ev in events:
        if after is not None and count == 0 and ev.seq != after + 1:
            raise _Gap(ev.seq)
        current = _apply_stored(st, current, stream, ev.seq, ev.type, ev.payload)
        count, last = count + 1, ev.seq
    return current, (-1 if last is None else last), count


def fold_events(st: State, stream: str, events: Iterable[StoredEvent]) -> BaseModel:
    """The state folded from the initial one over `events` (read as someone sees them: the admin's view of a
    sensitive aggregate for a reader without disclosure)."""
    return _fold(st, st.initial, stream, events)[0]


# -- loading ------------------------------------------------------------------------------------------
def _stream_of(st: State, id: str) -> tuple[str, str]:
    """(id as text, its stream id), checked before any SQL: a NUL in an aggregate id is InvalidStream, not a
    database error. A storable id is enough here (an aggregate stored before the id alphabet still loads);
    its first event (expected_seq -1) checks the alphabet (journal/ids.py). An id that is not a non-empty str
    (None, a number) is InvalidStream too: str() of it would name another stream (`Ticket-None`)."""
    check_stored_id(id, f"id of aggregate {st.name}")
    return id, check_stored_id(st.stream(id), f"stream id of {st.name}")


def _in_transaction() -> bool:
    return transaction.get_connection(Event.objects.db).in_atomic_block


def _remember(st: State, agg: Aggregate) -> None:
    """Put a state in the cache once it is committed: now, or when the caller's transaction commits.

    Inside a transaction the state may include uncommitted events (ours, or the caller's own
    appends); caching it before the commit could serve a state that a rollback un-writes.
    """
    key = (st.name, agg.stream)
    if st.sensitive:  # personal data is not kept in memory beyond the call (a forget must take effect)
        return
    if _in_transaction():
        transaction.on_commit(lambda: cache.put(key, agg, agg.version), using=Event.objects.db)
    else:
        cache.put(key, agg, agg.version)


def _from_snapshot(st: State, stream: str) -> tuple[BaseModel, int]:
    """The newest snapshot's state and seq, or the initial state at -1 (also if the schema moved on, or the state
    is sensitive) unless the stream was compacted: then replaying from the start would fold a partial stream, and
    CompactedStream is raised instead."""
    snap = None if st.sensitive else Snapshot.objects.latest(stream)
    if snap is None:
        if st.sensitive:
            _refuse_if_compacted(stream, f"{st.name} is sensitive now (its snapshots are never read)")
        return st.initial, -1
    try:
        return st.schema.model_validate(snap.state), snap.seq
    except ValidationError:
        _refuse_if_compacted(stream, f"its snapshot at seq {snap.seq} no longer fits {st.name}'s schema")
        logger.warning("snapshot of %s at seq %s no longer fits %s; replaying from the start", stream, snap.seq,
                       st.name)
        return st.initial, -1


def _refuse_if_compacted(stream: str, reason: str) -> None:
    """Raise CompactedStream if the stream no longer starts at seq 0 (journal/compaction.py)."""
    from journal.compaction import first_seq  # app registry: compaction imports the aggregates (a cycle)

    first = first_seq(stream, Event.objects.db)
    if first is not None and first > 0:
        raise CompactedStream(stream, first, reason)


def _on_shard(fn: Callable) -> Callable:
    """An aggregate entry point (state or action, id, ...) runs on its stream's shard (journal/shards.py)."""

    @functools.wraps(fn)
    def wrapper(target, id, *args, **kwargs):
        st = getattr(target, "state", target)
        try:
            stream = check_stored_id(st.stream(str(id)), "stream id")
        except Exception:  # the function itself refuses it, with its own error
            return fn(target, id, *args, **kwargs)
        with shards.on_stream(stream):
            return fn(target, id, *args, **kwargs)

    return wrapper


@_on_shard
def replay(st: State[S], id: str, *, use_snapshot: bool = True) -> Aggregate[S]:
    """Compute an aggregate from the journal, bypassing the cache (the admin shows this)."""
    st.check()
    id, stream = _stream_of(st, id)
    for _ in range(3):  # a gap means a compaction ran between our two reads: its newer snapshot is there now
        if use_snapshot:
            state, seq = _from_snapshot(st, stream)
        else:
            _refuse_if_compacted(stream, "a replay from seq 0 was asked for (use_snapshot=False)")
            state, seq = st.initial, -1
        try:
            state, last, count = _fold(st, state, stream, Event.objects.read(stream, after_seq=seq), after=seq)
        except _Gap as gap:
            if not use_snapshot:
                raise CompactedStream(stream, gap.args[0], "a replay from seq 0 was asked for") from None
            continue
        return Aggregate(st.name, id, stream, state, last if count else seq, count)
    raise CompactedStream(stream, -1, "its events and snapshots kept changing under three loads in a row")


@_on_shard
def load(st: State[S], id: str, *, fresh: bool = False) -> Aggregate[S]:
    """The aggregate `id` of state `st`.

    A cache hit (this process committed or loaded it before, and lost no race on it since) runs
    no query. `fresh=True` also reads the events other processes may have appended since, and only
    those. A miss replays the newest snapshot plus the events after it.
    """
    st.check()
    id, stream = _stream_of(st, id)
    # A state that became sensitive (a later declare()) ignores what was cached before it did.
    got = None if st.sensitive else cache.get((st.name, stream))
    if got is not None:
        cached, stale = got
        if not (stale or fresh):
            return cached
        try:
            state, last, count = _fold(st, cached.state, stream, Event.objects.read(stream, after_seq=cached.version),
                                       after=cached.version)
            agg = cached if not count else Aggregate(st.name, id, stream, state, last, cached.since_snapshot + count)
        except _Gap:  # compacted past our cached version: load from its newest snapshot
            agg = replay(st, id)
    else:
        agg = replay(st, id)
    _remember(st, agg)
    return agg


# -- committing ---------------------------------------------------------------------------------------
def _validate_input(action: Action, stream: str, payload: Any) -> BaseModel:
    if isinstance(payload, action.schema):
        return payload
    try:
        if isinstance(payload, BaseModel):
            payload = payload.model_dump()
        return action.schema.model_validate({} if payload is None else payload)
    except ValidationError as exc:
        raise InvalidActionPayload(action.name, stream, exc.errors(include_url=False)) from None


def _emitted(st: State, stream: str, result: Any) -> list[tuple[EventType, BaseModel]]:
    """Normalise what a handler returned into validated (event type, payload model) pairs."""
    if result is None:
        return []
    if isinstance(result, BaseModel) or (isinstance(result, tuple) and len(result) == 2
                                         and isinstance(result[0], str)):
        result = [result]
    out: list[tuple[EventType, BaseModel]] = []
    for item in result:
        if isinstance(item, BaseModel):
            name = st.name_of(type(item))
            if not name:
                problem = "is not declared" if name is None else "is declared under several names"
                raise DeclarationError(
                    f"{st.name}: event class {type(item).__name__} {problem}; return a (name, payload) pair"
                )
            out.append((st.events[name], item))  # an instance of the declared schema: already valid
            continue
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
            raise DeclarationError(f"{st.name}: an action must return events (models or (name, payload)), "
                                   f"not {item!r}")
        name, payload = item
        event = st.events.get(name)
        if event is None:
            raise DeclarationError(f"{st.name} does not declare an event named {name!r}")
        if not isinstance(payload, event.schema):
            try:
                data = payload.model_dump() if isinstance(payload, BaseModel) else payload
                payload = event.schema.model_validate(data)
            except ValidationError as exc:
                raise InvalidEventPayload(name, stream, exc.errors(include_url=False)) from None
        out.append((event, payload))
    return out


def _current_name(st: State, name: str) -> str:
    while name in st.successor:
        name = st.successor[name]
    return name


def _snapshot(st: State, stream: str, version: int, state: BaseModel) -> bool:
    """Checkpoint a state; a failure is logged, not raised: the events are the truth, this only speeds reads."""
    if st.sensitive:  # a checkpoint would hold in clear what the log holds sealed
        return False
    try:
        with atomic(Snapshot.objects.db):  # a savepoint inside a caller's transaction
            Snapshot.objects.save_state(stream, version, state.model_dump(mode="json"))
    except DatabaseError as exc:
        logger.warning("snapshot of %s at %s failed: %s", stream, version, exc)
        return False
    return True


@_on_shard
def do(action: Action[S, Any], id: str, payload: Mapping[str, Any] | BaseModel | None = None, *,
       actor: Actor = None, expected_version: int | None = None) -> Aggregate[S]:
    """Run `action` on aggregate `id` and commit the events it emits; return the new aggregate.

    expected_version: the version the caller last saw; if the stream is elsewhere the call raises
    ConcurrencyError without running the action. Raises InvalidActionPayload, InvariantViolated,
    InvalidEventPayload or ConcurrencyError, each with nothing written.
    """
    st = action.state
    st.check()
    id, stream = _stream_of(st, id)
    cmd = _validate_input(action, stream, payload)
    current = load(st, id)
    if expected_version is not None and current.version != expected_version:
        current = load(st, id, fresh=True)  # our cache may be behind another process
        if current.version != expected_version:
            raise ConcurrencyError(
                f"{action.name} on {stream}: expected version {expected_version}, the stream is at "
                f"{current.version}; nothing written", [stream]
            )
    for rule in action.given:
        if not rule.holds(current.state, actor):
            raise InvariantViolated(rule.description, stream, action.name, current.version)
    result = action.handler(current.state, cmd, actor) if action.takes_actor else action.handler(current.state, cmd)
    emitted = _emitted(st, stream, result)
    if not emitted:
        return current
    if st.deprecated:  # empty for states without _v<N> versions: one truth test, no lookups
        for event, _ in emitted:
            if event.name in st.deprecated:
                versioning.warn_deprecated(st.name, event.name, _current_name(st, event.name))

    # Fold first, append second: a patch that raises leaves the journal untouched.
    state = current.state
    envelopes = []
    meta = {"action": action.name, "actor": actor}
    for offset, (event, model) in enumerate(emitted):
        data = model.model_dump(mode="json")
        if event.patch is not None:
            state = _merge(state, event.patch(state, model))
        else:
            state = _apply_stored(st, state, stream, current.version + 1 + offset, event.name, data)
        data[META] = meta
        envelopes.append(Envelope(event.name, data))
    try:
        appended = Event.objects.append(stream, envelopes, expected_seq=current.version)
    except ConcurrencyError:
        cache.mark_stale((st.name, stream))  # never serve it again without reading what we missed
        raise

    since = current.since_snapshot + len(envelopes)
    if st.snapshot_every is not None and since >= st.snapshot_every and _snapshot(st, stream, appended.last_seq,
                                                                                    state):
        since = 0
    committed = tuple(Committed(seq, env.type, env.payload) for seq, env in zip(appended.seqs, envelopes,
                                                                                  strict=True))
    agg = Aggregate(st.name, id, stream, state, appended.last_seq, since, committed)
    _remember(st, agg)
    return agg


# -- retrying under contention ---------------------------------------------------------------------------
_STRIPES = 256
_turns = [threading.RLock() for _ in range(_STRIPES)]
_holding = threading.local()


@contextmanager
def _in_process_turn(stream: str) -> Iterator[None]:
    """Threads of this process retrying on the same stream take turns instead of racing each other.

    An optimisation only (it cannot see other processes; the journal's expected-seq guard decides every
    commit): without it, N threads of one process would make each other lose N-1 races per commit.
    Streams share 256 striped re-entrant locks; a thread already holding one (an action whose handler
    commits to another aggregate) does not wait for a second, so two threads cannot deadlock on them.
    """
    if getattr(_holding, "turn", None) is not None:
        yield
        return
    turn = _turns[hash(stream) % _STRIPES]
    with turn:
        _holding.turn = turn
        try:
            yield
        finally:
            _holding.turn = None


def _queued_attempt(stream: str) -> AbstractContextManager[None]:
    """A retry's attempt inside a transaction that first queues behind the other retriers of the stream.

    On PostgreSQL a transaction-scoped advisory lock (journal/store/postgres.py LOCK_STREAM); on SQLite the
    transaction begins IMMEDIATE, holding the write lock, so the attempt cannot lose at all. Losers of a
    race therefore stop fighting each other: only first attempts (which take no lock) can still beat the
    lock holder, and each of those commits or joins the queue. Inside a caller's transaction the lock
    would be held until the caller commits, so there the attempt runs as is (backoff only).
    """
    alias = Event.objects.db
    if transaction.get_connection(alias).in_atomic_block:
        return nullcontext()
    return _locked(alias, stream)


@contextmanager
def _locked(alias: str, stream: str) -> Iterator[None]:
    with atomic(alias):
        store_for(alias).lock_stream(stream)
        yield


HOT_SECONDS = 2.0
"""After this process loses a race on a stream, its commits to that stream queue from their first attempt
for this long. A winner that never loses would otherwise keep beating the queue: its first attempt needs
no read (its cache holds its own last commit), so it reaches the append before a queued retrier does."""

_hot: dict[str, float] = {}  # stream -> time.monotonic() until which its commits queue


def _mark_hot(stream: str) -> None:
    if len(_hot) > 10_000:  # bounded: forgetting a mark only means one more optimistic attempt
        _hot.clear()
    _hot[stream] = time.monotonic() + HOT_SECONDS


def backoff_delay(attempt: int, backoff_ms: float, max_backoff_ms: float) -> float:
    """Seconds to sleep after lost race number `attempt`: "full jitter", a random 0..min(cap, base * 2^(n-1))."""
    return random.uniform(0, min(max_backoff_ms, backoff_ms * 2 ** min(attempt - 1, 30))) / 1000


@_on_shard
def do_with_retry(action: Action[S, Any], id: str, payload: Mapping[str, Any] | BaseModel | None = None, *,
                  actor: Actor = None, attempts: int = 10, backoff_ms: float = 2.0, max_backoff_ms: float = 100.0,
                  on_conflict: Callable[[int, ConcurrencyError], None] | None = None) -> Aggregate[S]:
    """`do`, re-loading and re-running the action when it loses an optimistic-concurrency race.

    Each retry re-reads only the events it missed, re-checks the invariants on the new state and
    re-runs the handler, so an action that is no longer allowed fails with InvariantViolated.
    Under contention every caller gets through (docs/aggregates.md): threads of one process take turns
    on a stream; after a lost race a caller sleeps a jittered, exponentially growing delay (capped at
    `max_backoff_ms`) and makes its next attempts queued behind the stream's other retriers (a
    database lock; see `_queued_attempt`), as are this process's first attempts on that stream for
    HOT_SECONDS after it lost a race there. After `attempts` lost races it raises RetriesExhausted (a
    ConcurrencyError). Other errors are not retried: they would fail the same way again.
    `on_conflict(attempt, error)` is called after each lost race (for metrics or logs).
    """
    if attempts < 1:
        raise ValueError("attempts must be at least 1")
    st = action.state
    _, stream = _stream_of(st, id)
    cmd = _validate_input(action, stream, payload)
    with _in_process_turn(stream):
        optimistic = _hot.get(stream, 0.0) < time.monotonic()
        for attempt in range(1, attempts + 1):
            try:
                if attempt == 1 and optimistic:  # the uncontended path: no lock, no transaction
                    return do(action, id, cmd, actor=actor)
                with _queued_attempt(stream):
                    return do(action, id, cmd, actor=actor)
            except ConcurrencyError as exc:
                _mark_hot(stream)
                if on_conflict is not None:
                    on_conflict(attempt, exc)
                if attempt == attempts:
                    raise RetriesExhausted(action.name, stream, attempts) from exc
                if backoff_ms > 0:
                    time.sleep(backoff_delay(attempt, backoff_ms, max_backoff_ms))
    raise AssertionError("unreachable")
