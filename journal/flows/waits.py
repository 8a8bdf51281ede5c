"""Flows that wait: durable timers, messages, events, children, suspend, continue-as-new, fork.

A run that must wait longer than LOOM_WAIT_INLINE_MAX PARKS: what it waits for is in its log
(WAIT_STARTED with the absolute due time, or a STEP_FAILED with its backoff's end), and in one row of
journal_wait (kind, due time, the fence it parked under); its header says `waiting`; the run returns,
giving up its thread and its lease. Any worker's waker (leases/waker.py, or `wake_due()` here) claims
due rows (SKIP LOCKED on PostgreSQL): the claim deletes the row, advances the fence from the parked
token and sets the header running in one transaction, then resumes the execution under that fence;
the replay finds the wait recorded and ends it (its time has come, its message is there, its child
settled) or parks again. A waker that dies after its claim leaves a running execution without a
lease, which the recovery sweep takes over like any orphan.

Messages are rows of journal_message until a recv consumes one: the consumption and the recv's
STEP_COMPLETED commit in one transaction, so each message is consumed exactly once. `send` and `park`
lock the recipient's header first, so a message that lands while the recipient parks is seen by the
park (parked due now) or wakes the row it committed.

Shards (journal/shards.py): every public function naming an execution runs on its shard (`by_stream`), a
new execution (a scheduled start, a child, the next run of a chain, a fork) is written on its own shard
(`schedule` binds it), and `wake_due`/`next_due_in` and the worker's waker go over every shard. A chain's
runs (`<root>~<n>`) and default child ids (`<parent>.child-<pos>`) are placed with their root
(`shards.family`), so a continue's message carry and a child's wake of its parent stay one statement on
one shard; a child with an id of its own on another shard wakes its parent after its settle commits.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ulid import ULID

from journal import conf, envelopes, jsonvalues, shards
from journal.atomic import atomic
from journal.envelopes import Envelope
from journal.exceptions import InvalidPayload, InvalidStream, StaleFence, StreamExists
from journal.flows import event_listener, writer
from journal.flows import events as ev
from journal.flows.context import WaitSpec, check_label, check_name, check_seconds, iso, now, parse_time
from journal.flows.errors import (
    ExecutionExists,
    ExecutionFinished,
    InvalidInput,
    UnknownExecution,
)
from journal.flows.outcome import Outcome
from journal.flows.registry import prepare_start
from journal.flows.state import COMPLETED, TERMINAL, ExecutionState, load_state
from journal.flows.state import SETTLED_COMPLETED as COMPLETED_STATUS
from journal.identity import node_identity
from journal.ids import check_stored_id
from journal.models import Event, Fence
from journal.store import store_for
from journal.store.base import WaitRecord

log = logging.getLogger("loom.flows")

WAITING_STATUS = writer.WAITING_STATUS  # a parked run's header status (writer.park writes it)
SUSPENDED_STATUS = "suspended"


def _store(execution_id: str | None = None):
    """The journal store of `execution_id`'s shard, or of the bound alias (the run's, the entry point's)."""
    return store_for(shards.shard_for(execution_id) if execution_id is not None else Event.objects.db)


def _alias() -> str:
    return Event.objects.db


# == what the engine asks (journal/flows/runtime.py's Runner): the policy, never a call back into the run ========
# A run's own writes are the writer's (journal/flows/writer.py): its wait row (writer.park), a settle's message carry
# and parent wake-up (in its write pass: writer.Settle.onward, parent); a recv's consume is the engine's own step.


def put_event(execution_id: str, key: str, value: Any) -> None:
    _store(execution_id).put_flow_event(execution_id, key, jsonvalues.dumps(value, f"event {key!r}"))


def spawn_child(parent_id: str, flow: str, stored: Any, child_id: str) -> str:
    """Write the child (scheduled now: a worker runs it); a replay finding it written goes on."""
    try:
        schedule(flow, stored, child_id, now(), {"$parent": parent_id})
    except ExecutionExists:
        parent = _started_payload(child_id).get("$parent")
        if parent != parent_id:
            raise
    return child_id


def _started_payload(execution_id: str) -> dict:
    first = Event.objects.read(execution_id, limit=1)
    return first[0].payload if first and first[0].type == ev.EXECUTION_STARTED else {}


#: A child's settled statuses as its parent's wait sees them: `stuck` (the recovery sweep gave up on
#: it) ends the wait too, as a failure (ChildFailed 'stuck'); the parent would re-check it forever.
CHILD_SETTLED = TERMINAL | {"stuck"}


def _continued(header) -> bool:
    """Whether a header is that of a run that continued as new (settled `completed` with
    {"continued_as": next}, written only by the ContinueAsNew branch of drive())."""
    status, _, result, _ = header
    return status == COMPLETED_STATUS and isinstance(result, dict) and list(result) == ["continued_as"]


def chain_current(execution_id: str) -> str:
    """The newest run of the continue_as_new chain `execution_id` belongs to (itself if it never
    continued). Runs are `<root>~<n>`, each written only after run n-1 (by its continue_run), and carry
    `$root`: "run k exists with our $root" is true up to the newest run and false after it, so a
    galloping then binary search finds it in O(log chain length) reads of one first event each."""
    started = _started_payload(execution_id)
    root = started.get("$root") or execution_id
    base = int(started.get("$n") or 0)

    def link(k: int) -> str:
        return root if k == 0 else f"{root}~{k}"

    def exists(k: int) -> bool:
        return k == base or _started_payload(link(k)).get("$root") == root

    step = 1
    while exists(base + step):
        step *= 2
    lo, hi = base + step // 2 if step > 1 else base, base + step
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if exists(mid):
            lo = mid
        else:
            hi = mid
    return link(lo)


def child_outcome(child_id: str) -> tuple[dict | None, str]:
    """(the child's outcome, or None while it has not settled; the run to wait on). A child that
    continued as new is followed to the newest run of its chain: the parent waits for the chain's last
    run (whose settle wakes it: every run of the chain carries `$parent`)."""
    header = writer.header_status(child_id)
    if header is None:
        raise UnknownExecution(child_id)
    link = child_id
    while _continued(header):
        current = chain_current(link)
        if current == link:
            break
        link = current
        header = writer.header_status(link)
    status, _, result, error = header
    if status not in CHILD_SETTLED:
        return None, link
    return {"status": status, "result": result, "error": error or None}, link


def _current_run(execution_id: str, header=None) -> str:
    """The run that stands for `execution_id` now: itself, or the newest run of its chain if it
    continued as new."""
    header = header or writer.header_status(execution_id)
    return chain_current(execution_id) if header is not None and _continued(header) else execution_id


def after_settle(state: ExecutionState) -> None:
    """A run that waited drops its wait row (best effort: a stale row is deleted by the next claim)."""
    # Wait primitives ("$..." steps), a scheduled start, or a parked retry backoff (a STEP_FAILED with
    # its backoff's end: record[4]) may have left a row (a cancel of a parked run, say).
    waited = (any(record[0].startswith("$") or len(record) > 4 for record in state.steps)
              or state.meta.get("$start_at"))
    if not waited:
        return
    try:
        _store(state.execution_id).drop_wait(state.execution_id)
    except Exception:  # the settle committed; the next claim deletes the stale row
        log.exception("after the settle of %s: could not drop its wait row", state.execution_id)


def schedule(flow: str, stored: Any, execution_id: str, due, extra: dict | None = None) -> Outcome:
    """Write a new execution that starts at `due` (EXECUTION_STARTED with $start_at, then parked), on its
    own shard; ExecutionExists if the id is taken (nothing written)."""
    with shards.on_stream(execution_id):
        return schedule_here(flow, stored, execution_id, due, extra)


def schedule_here(flow: str, stored: Any, execution_id: str, due, extra: dict | None = None) -> Outcome:
    """`schedule` on the bound shard: the caller (runtime.start) bound the execution's already."""
    payload = {"flow": flow, "input": stored, "$start_at": iso(due), **(extra or {})}
    run = writer.RunHandle(execution_id, flow, stored)
    try:
        writer.write(run, [Envelope(ev.EXECUTION_STARTED, payload)])
    except StreamExists:
        raise writer.exists_error(execution_id) from None
    except InvalidPayload as exc:
        raise InvalidInput(str(exc)) from None
    deadline = (extra or {}).get("$deadline")
    wake_at = due if not deadline or parse_time(deadline) > due else parse_time(deadline)
    writer.park(run, WaitSpec("start", -1, wake_at))  # a fresh bootstrap's fence: nobody took it over
    return Outcome(execution_id, WAITING_STATUS, None, None)


def continue_run(state: ExecutionState, flow, input: Any) -> str:
    """Start the next run of a continue_as_new chain (id `<root>~<n>`, deterministic: a replay finds
    it written); returns its id."""
    root = state.meta.get("$root") or state.execution_id
    n = int(state.meta.get("$n") or 0) + 1
    next_id = f"{root}~{n}"
    definition, _, stored, next_id = prepare_start(flow, input, next_id)
    extra = {"$previous": state.execution_id, "$root": root, "$n": n}
    # The chain is one execution to its parent (its last run's settle wakes it) and to its deadline
    # (a per-execution timeout bounds the whole chain, not only its first run).
    for key in ("$parent", "$deadline"):
        if state.meta.get(key):
            extra[key] = state.meta[key]
    try:
        schedule(definition.name, stored, next_id, now(), extra)
    except ExecutionExists:
        if _started_payload(next_id).get("$previous") != state.execution_id:
            raise
    return next_id


# == the public functions ==============================================================================
@shards.by_stream
def send(execution_id: str, topic: str, payload: Any, message_id: str | None = None) -> str:
    """Send a message to an execution (from anywhere); returns its message_id. Idempotent by
    message_id: a second send of one id writes nothing. The message waits until a ctx.recv of its
    topic consumes it; a recipient waiting on the topic is woken at once.

    UnknownExecution, ExecutionFinished (settled), InvalidInput (topic, id or payload): nothing written."""
    check_label(topic, "topic")
    if message_id is None:
        message_id = str(ULID())
    check_label(message_id, "message_id")
    try:
        check_stored_id(execution_id, "execution id")
        text = jsonvalues.dumps(payload, "message payload")
    except InvalidPayload as exc:
        raise InvalidInput(str(exc)) from None
    except Exception as exc:  # InvalidStream: an id no database can hold
        raise InvalidInput(str(exc)) from None
    if len(text.encode()) > conf.get("LOOM_MAX_PAYLOAD_BYTES"):
        raise InvalidInput(f"message payload is larger than LOOM_MAX_PAYLOAD_BYTES "
                           f"({conf.get('LOOM_MAX_PAYLOAD_BYTES')})")
    # A run that continued as new forwards: the message goes to the newest run of its chain (the id a
    # caller knows keeps accepting messages for the whole endless flow).
    target, visited = execution_id, []
    while True:
        status, _ = _store(target).send_message(target, topic, message_id, text, now())
        if status is None:
            raise UnknownExecution(execution_id)
        if status not in TERMINAL:
            return message_id
        visited.append(target)
        header = writer.header_status(target)
        current = chain_current(target) if header is not None and _continued(header) else target
        if current == target:
            # Identity before state: a send of an id already used (a send step re-run after a crash, a
            # client's retry) is the same send, whatever the recipient did since; only a new id is refused.
            if any(_store(run).message_sent(run, message_id) for run in visited):
                return message_id
            raise ExecutionFinished(execution_id, status, "the message")
        target = current


@shards.by_stream
def get_event(execution_id: str, key: str, timeout: float | None = None, default: Any = None) -> Any:
    """The value the execution published with ctx.set_event(key, ...), waiting up to `timeout`
    seconds for it (NOTIFY wake-up on PostgreSQL, polls of LOOM_WAIT_POLL on SQLite); `default` if
    still unset. UnknownExecution for an unknown id; InvalidInput for a bad key or timeout."""
    check_name(key, "event key")
    wait = 0.0 if timeout is None else check_seconds(timeout, "get_event timeout")
    try:
        check_stored_id(execution_id, "execution id")
    except Exception as exc:
        raise InvalidInput(str(exc)) from None
    store = _store()
    header = writer.header_status(execution_id)
    if header is None:
        raise UnknownExecution(execution_id)
    target = _current_run(execution_id, header)  # a chain's events: its newest run's (carried along)
    found, value = _store(target).flow_event(target, key)
    if found:
        return value
    if wait <= 0:
        return default
    until = time.monotonic() + wait
    # PostgreSQL: one LISTEN session per process and alias, shared by every waiting caller
    # (journal/flows/event_listener.py); it wakes this caller for its run's set_event, and the pause
    # below bounds the wait anyway (the poll while the session is down, and on SQLite).
    waiter = event_listener.listener_for(_alias()).waiter(target) if store.wait_notifications else None
    try:
        while True:
            if waiter is not None:
                waiter.follow(target)  # subscribed before the chain is resolved and the value read
            current = _current_run(target)
            if current != target:  # continued as new: listen for the newest run, then read it
                target = current
                continue
            found, value = _store(target).flow_event(target, key)
            if found:
                return value
            left = until - time.monotonic()
            if left <= 0:
                return default
            pause = min(left, conf.get("LOOM_WAIT_POLL"))
            if waiter is not None:
                waiter.wait(pause)
            else:
                time.sleep(pause)
    finally:
        if waiter is not None:
            waiter.close()


@shards.by_stream
def wake_now(execution_id: str) -> bool:
    """End the execution's current wait now (recorded as WAIT_WOKEN: a sleep or backoff ends, a recv
    returns None unless a message came, a child wait re-checks) and make it due for a waker. False
    if it is not waiting; UnknownExecution, ExecutionFinished."""
    check_stored_id(execution_id, "execution id")  # InvalidStream before any SQL
    store = _store()
    try:
        with atomic(_alias()):
            status = store.lock_execution(execution_id)
            if status is None:
                raise UnknownExecution(execution_id)
            if status in TERMINAL:
                raise ExecutionFinished(execution_id, status, "the wake-up")
            wait = store.wait_of(execution_id)
            if status != WAITING_STATUS or wait is None:
                return False
            token = Fence.objects.advance(execution_id, wait["token"])
            state = load_state(execution_id)
            Event.objects.append(execution_id, Envelope(ev.WAIT_WOKEN, {"pos": wait["pos"], "by": node_identity()}),
                                 fence_token=token, expected_seq=state.seq)
            store.park(WaitRecord(execution_id, wait["flow"], wait["kind"], wait["pos"], token, now(),
                                  wait["topic"], wait["child"]), WAITING_STATUS)
    except StaleFence:
        return False  # taken over since it parked: that run decides
    return True


@shards.by_stream
def waiting_on(execution_id: str) -> dict | None:
    """What a waiting execution waits for (the admin, the API): kind, due_at, topic, child, pos,
    token; None if it has no wait row."""
    found = _store().wait_of(check_stored_id(execution_id, "execution id"))
    if found is None:
        return None
    return {k: (found[k] or None) if k in ("topic", "child") else found[k]
            for k in ("kind", "due_at", "topic", "child", "pos", "token")}


@shards.by_stream
def pending_messages(execution_id: str, limit: int = 50) -> list[dict]:
    """The newest messages of an execution (consumed or not), newest first (the admin)."""
    return _store().messages_of(check_stored_id(execution_id, "execution id"), limit)


@shards.by_stream
def fork(execution_id: str, from_step: int, execution_id_new: str | None = None) -> str:
    """A new execution of the same flow and input that replays the recorded results of the steps
    before position `from_step` and runs the rest again (after a fix in the code). Scheduled now: a
    worker runs it (or resume(new id)). Returns the new id.

    UnknownExecution; InvalidInput if from_step is not a position whose earlier steps all completed;
    ExecutionExists if the new id is taken. Nothing is written then."""
    check_stored_id(execution_id, "execution id")  # InvalidStream before any SQL
    events = Event.objects.read(execution_id)
    if not events:
        raise UnknownExecution(execution_id)
    state = ExecutionState(execution_id)
    for event in events:
        state.apply(event.seq, event.type, event.payload)
    if not state.flow:
        raise UnknownExecution(execution_id)
    if isinstance(from_step, bool) or not isinstance(from_step, int) or not 0 <= from_step <= len(state.steps):
        raise InvalidInput(f"from_step must be a step position from 0 to {len(state.steps)}, got {from_step!r}")
    copied = []
    for pos, record in enumerate(state.steps[:from_step]):
        if record[1] != COMPLETED:
            raise InvalidInput(f"step {record[0]!r} at position {pos} did not complete; fork from {pos} or earlier")
        if record[0] == "$start_child":
            # The policy: a fork owns its children. Copying this record would make the fork share the
            # original's child (its result, its cancellation); forking from here re-runs start_child,
            # which starts the fork's own child under an id derived from the fork's id.
            raise InvalidInput(f"step {pos} started child {record[2]!r} of {execution_id!r}: a fork does not "
                               f"share the original's children; fork from {pos} or earlier (the fork then "
                               f"starts its own child)")
        copied.append(list(record[:4]))
    new_id = execution_id_new or str(ULID())
    try:
        envelopes.check_new_stream_id(new_id)  # looked up at the call, as registry.prepare_start does
    except InvalidStream as exc:
        raise InvalidInput(str(exc)) from None
    # The fork replays the original's records, so it runs on the original's version (docs/flows.md "Versions").
    extra = {"$forked_from": {"execution_id": execution_id, "from_step": from_step}, "$steps": copied,
             "$version": int(state.meta.get("$version") or 1)}
    schedule(state.flow, state.input, new_id, now(), extra)
    return new_id


def next_due_in(flows=None, alias: str | None = None) -> float | None:
    """Seconds until the earliest wait (of `flows`, if given) is due (0 if one is due now), None if
    nothing waits with a timer; over every shard, or `alias` only."""
    dues = [due for one in ([alias] if alias is not None else shards.shards())
            if (due := store_for(one).next_wait_due(flows)) is not None]
    return None if not dues else max(0.0, (min(dues) - now()).total_seconds())


__all__ = [
    "fork",
    "get_event",
    "next_due_in",
    "pending_messages",
    "send",
    "waiting_on",
    "wake_now",
]
