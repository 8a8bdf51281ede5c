"""Queued executions: accepted now, begun later by a worker (the journal's half of every queued start).

A queued start is an execution from the moment it is accepted: `write_queued` writes its EXECUTION_STARTED
(through the writer, so marked input fields are sealed exactly as for any start and `forget` reaches them)
and its header with status `queued`, in the CALLER's transaction: the queues app writes its entry row in
the same one (queues/enqueuing.py), so an execution is never queued without its entry nor an entry left
without its execution. From then on it is listed, shown, cancelled, messaged and forgotten like any other.

`run_queued` is the worker's half: in one transaction it checks that the claim still holds (the queues
app's callback), locks the header, advances the fence from the token written at enqueue and sets the
header running; then the flow runs from its log (the input is read from the journal, never from the
entry), on the flow version the execution is pinned to (its header's flow_version, stamped at enqueue),
never on whatever is newest in the worker. A claim offered again and begun twice is refused by the fence:
one run, whoever is second does nothing. A queued execution is neither running nor waiting: the recovery
sweep (status running) and the waker (wait rows) never touch it; its entry's claim timeout handles a claim
that was lost.

The journal imports nothing from the queues app: the queues app calls these functions.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from journal import shards
from journal.atomic import atomic
from journal.envelopes import Envelope
from journal.exceptions import InvalidPayload, StaleFence, StreamExists
from journal.flows import events as ev
from journal.flows import writer
from journal.flows.context import _error_text, check_seconds, iso, now
from journal.flows.errors import ExecutionExists, InvalidInput, UnknownFlow
from journal.flows.outcome import Outcome
from journal.flows.ownership import get_ownership
from journal.flows.registry import get_flow, versions
from journal.flows.runtime import Runner
from journal.flows.state import RUNNING, load_state
from journal.models import Event, Execution, Fence
from journal.store import store_for

QUEUED = "queued"
#: The fence token a queued execution is written under (the bootstrap's): its runner advances from it.
QUEUED_FENCE = 1

#: What run_queued reports instead of an outcome when it ran nothing.
NOT_HELD = "cancelled"  # the claim no longer holds (cancelled, or offered again since the claim)
LEGACY = "legacy"  # no header: an entry written before queued executions (its input is in the entry)
#: This process lacks the flow version the execution is pinned to (a race with a deploy): nothing was run
#: or changed, not even the claim's begin, so the entry is offered again after its claim timeout
#: (LOOM_QUEUE_CLAIM_TIMEOUT) to a worker whose dequeue filters on the versions it has.
ELSEWHERE = "elsewhere"

# What the queues app's enqueue checks and writes with the journal's rules (a timeout, the deadline's clock and
# text), named here, in the face of the queued start, rather than imported from the runtime's insides.
__all__ = ["ELSEWHERE", "LEGACY", "NOT_HELD", "QUEUED", "QUEUED_FENCE", "check_seconds", "iso", "now", "pinned_version",
           "run_queued", "runs_here", "started_by", "write_queued"]


def write_queued(flow: str, stored: Any, execution_id: str, *, meta: dict | None = None,
                 deadline: datetime | None = None, options: dict | None = None) -> writer.RunHandle:
    """Write a queued execution in the caller's transaction (on the execution's shard, bound by the
    caller): EXECUTION_STARTED {flow, input, $meta, $deadline, $queue} and its header, status queued.
    ExecutionExists if the id is taken (nothing written); InvalidInput for a payload the journal refuses."""
    payload: dict = {"flow": flow, "input": stored}
    if deadline is not None:
        payload["$deadline"] = iso(deadline)
    if meta:
        payload["$meta"] = meta
    if options:
        payload["$queue"] = options  # where it was queued (queue, partition, priority, dedup id, not before)
    run = writer.RunHandle(execution_id, flow, stored)
    try:
        # A savepoint: a refused bootstrap leaves the caller's transaction usable (the refusal's read below).
        with atomic(Event.objects.db):
            writer.write(run, [Envelope(ev.EXECUTION_STARTED, payload)])
            # Same transaction as the bootstrap: nobody sees the execution running before it is queued.
            store_for(Event.objects.db).set_execution_status(execution_id, run.token, QUEUED)
    except StreamExists:
        raise writer.exists_error(execution_id) from None
    except InvalidPayload as exc:
        raise InvalidInput(str(exc)) from None
    return run


def started_by(execution_id: str) -> tuple[str, str] | None:
    """(flow, started_by) of an execution as its log recorded them ("" when no starter was named), or None
    for an unknown id: what decides whether a repeated start is the same starter's (never the input)."""
    header = writer.header_status(execution_id)
    if header is None:
        return None
    first = Event.objects.read(execution_id, limit=1)
    payload = first[0].payload if first and first[0].type == ev.EXECUTION_STARTED else {}
    meta = payload.get("$meta") if isinstance(payload, dict) else None
    who = meta.get("started_by") if isinstance(meta, dict) else None
    return header[1], who if isinstance(who, str) else ""


def pinned_version(execution_id: str) -> int | None:
    """The flow version the execution is pinned to (its header's flow_version, stamped at enqueue and never
    changed), or None when it has no header (an entry written before queued executions). Call it bound to
    the execution's shard (shards.on_stream), as the callers here are."""
    return Execution.objects.filter(pk=execution_id).values_list("flow_version", flat=True).first()


@shards.by_stream
def runs_here(execution_id: str, flow: str) -> bool:
    """Whether this process has the flow version the execution is pinned to (any version of `flow` when it
    has no header): the queues app asks it before it begins a handed-over resume, so that a worker without
    the version changes nothing, not even its claim's begin (the entry is offered again after its claim
    timeout, to a worker that has the version)."""
    try:
        get_flow(flow, pinned_version(execution_id))
    except UnknownFlow:
        return False
    return True


@shards.by_stream
def run_queued(execution_id: str, flow: str, claim_holds: Callable[[], bool]) -> Outcome | str:
    """Begin a queued execution and run it to its end in this thread, on the flow version it is pinned to:
    its Outcome, or NOT_HELD (the claim no longer holds: nothing done), LEGACY (no header: the caller starts
    it the old way; the claim's begin committed), ELSEWHERE (this process lacks its version: nothing done,
    not even the begin, so the claim is offered again after the claim timeout to a worker that has it), or
    the header's status when it is no longer queued (cancelled, or begun by another claim: nothing run here).

    One transaction: `claim_holds()` (the entry's begin, under its row lock), the header's lock, the fence
    advanced from QUEUED_FENCE (a second begin, through a claim offered again, is refused by it) and the
    status queued -> running. The flow must be registered here (UnknownFlow, before anything changes)."""
    # The version was stamped with the header at enqueue and never changes: read before the begin, so that
    # a process without it (a race with a deploy: the dequeue filters on the versions a worker has) leaves
    # the entry untouched. No header: an old entry, which runs the old way on the newest version here.
    version = pinned_version(execution_id)
    try:
        definition = get_flow(flow, version)
    except UnknownFlow:
        if version is None or not versions(flow):
            raise  # the flow itself is unknown here (the dispatcher claims no such entry)
        return ELSEWHERE
    store = store_for(Event.objects.db)
    with atomic(Event.objects.db):
        if not claim_holds():
            return NOT_HELD
        status = store.lock_execution(execution_id)
        if status is None:
            return LEGACY
        if status != QUEUED:
            return status
        header_flow = writer.header_status(execution_id)[1]
        if header_flow != definition.name:  # an entry that names another flow than its execution's
            raise ExecutionExists(execution_id, status, header_flow)
        try:
            token = Fence.objects.advance(execution_id, QUEUED_FENCE)
        except StaleFence:
            return status  # begun (or taken) by someone else since it was queued: theirs to run
        store.set_execution_status(execution_id, token, RUNNING)
    state = load_state(execution_id)
    if state.settled:
        return Outcome(execution_id, state.status, state.result, state.error or None)
    run = writer.RunHandle(execution_id, definition.name, state.input, token=token, tip=state.seq)
    try:
        value, _ = definition.prepare(state.input, check_json=False)  # from the log (sealed fields revealed)
    except Exception as exc:  # e.g. a field forgotten while queued no longer fits the flow's input model
        runner = Runner(run, state, None)
        return _refused(runner, f"its input cannot start the flow any more: {_error_text(exc, runner.secrets())}")
    # fresh: a queued execution just begun is a fresh start to its ownership (lazy lease: none is written
    # for a run shorter than the grace; its header's updated_at, set by the begin, starts the orphan window).
    claim = get_ownership().begin(execution_id, token, fresh=True)
    return Runner(run, state, claim).drive(definition, value)


def _refused(runner, error: str) -> Outcome:
    """Fail a begun queued execution whose input the flow refuses (nothing of the flow ran)."""
    error = error[:2000]
    runner.emit(ev.EXECUTION_FAILED, {"error": error})
    runner.flush(writer.Settle("failed", None, error))
    return Outcome(runner.run.execution_id, "failed", None, error)
