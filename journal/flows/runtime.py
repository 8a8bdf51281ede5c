"""Running durable flows: start, resume, retry, cancel. A run happens in the caller's thread.

Statement cost of a fresh run of n steps that succeed first time (the hot path): n + 1 writes.
The bootstrap writes EXECUTION_STARTED and the first STEP_STARTED with fence token 1 and the
header row in one statement; each later write carries a step's STEP_COMPLETED with the next
STEP_STARTED, and the last carries the final STEP_COMPLETED, EXECUTION_COMPLETED and the settled
header. No read happens on that path. Every write goes through journal/flows/writer.py `write()`.
"""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, connections
from django.db.models.functions import Now

from journal import conf, shards, telemetry
from journal.atomic import atomic
from journal.envelopes import Envelope
from journal.exceptions import SequenceConflict, StaleFence, StreamExists, UnknownStream
from journal.flows import aio, ownership, registry, waits, writer
from journal.flows import events as ev
from journal.flows.context import (
    ContinueAsNew,
    DurableContext,
    Halt,
    Park,
    WaitSpec,
    _error_text,
    _jsonable,
    check_moment,
    check_seconds,
    exit_trace,
    inline_max,
    iso,
    now,
    parse_time,
)
from journal.flows.errors import (
    DeadlineExceeded,
    ExecutionBusy,
    ExecutionExists,
    ExecutionFinished,
    FlowError,
    InvalidInput,
    NotResumable,
    OwnershipLost,
    ShuttingDown,
    StepFailed,
    UnknownExecution,
)
from journal.flows.outcome import Outcome
from journal.flows.ownership import Claim, get_ownership
from journal.flows.plugins import CANCEL_HOOKS, QUEUE_STARTS, RERUN_HOOKS, check_queue, enqueue_resume
from journal.flows.registry import Flow, get_flow, prepare_start
from journal.flows.state import (
    CANCELLED,
    COMPLETED,
    RUNNING,
    SETTLED_FAILED,
    TERMINAL,
    ExecutionState,
    checkpoint,
    load_state,
    marked_values,
    snapshot_every,
)
from journal.flows.state import FAILED as FAILED_STEP
from journal.identity import node_identity
from journal.models import Event, Execution, Fence, Snapshot
from journal.privacy import codec, marking
from journal.privacy.codec import Sealed
from journal.store import store_for

log = logging.getLogger("loom.flows")


class Runner:
    """One run of one execution: its pending events, its folded state, its claim."""

    __slots__ = ("claim", "continued_to", "deadline_signalled", "every", "let_go", "pending", "recovered",
                 "released", "run", "state", "yielded")

    def __init__(self, run: writer.RunHandle, state: ExecutionState, claim: Claim | None):
        self.run = run
        self.state = state
        self.claim = claim
        self.pending: list[Envelope] = []
        self.every = snapshot_every()
        self.released = False  # the settle statement deleted the run's lease row
        self.let_go = False  # the run settled or parked: the execution is no longer running under us
        self.yielded = False  # the run stopped at a step boundary for a graceful shutdown (ShuttingDown)
        self.deadline_signalled = False  # DeadlineExceeded was raised in this run (a handler may go on)
        self.continued_to: str | None = None  # the next run of a continue_as_new (its settle carries messages)
        # A resume notes who took over in its first STEP_STARTED ("recovered_by": the admin's
        # timeline marks the attempt it interrupted); the event count does not change.
        self.recovered: dict | None = None

    def emit(self, type_: str, payload: dict) -> None:
        """Queue an event and fold it; it is written by the next flush."""
        if self.recovered is not None and type_ == ev.STEP_STARTED:
            payload, self.recovered = {**payload, "recovered_by": self.recovered}, None
        self.state.apply(self.run.tip + len(self.pending) + 1, type_, payload)
        self.pending.append(Envelope(type_, payload))
        telemetry.on_event(self, type_, payload)  # spans of steps and waits, metrics (a no-op when off)

    def flush(self, settle: writer.Settle | None = None) -> None:
        """Write the queued events (the bootstrap, for the first flush of a fresh start)."""
        envelopes, self.pending = self.pending, []
        run = self.run
        fresh = run.token is None
        if fresh and settle is None:
            # An ownership with a companion may write the lease in the bootstrap statement itself.
            inline = ownership.inline_lease()
            if inline is not None:
                run.companion, run.lease = inline
        elif settle is not None and self.claim is not None:
            owner = getattr(self.claim, "settle_owner", None)
            if owner is not None:  # ... and delete it in the settle statement
                settle.companion, settle.lease_owner = ownership.companion(), owner
        if settle is not None:  # what the settle owes others, written in its transaction (writer.write)
            settle.parent, settle.onward = self.state.meta.get("$parent"), self.continued_to
        try:
            writer.write(run, envelopes, settle)
        except StreamExists:
            raise Halt(_exists(run.execution_id)) from None
        except UnknownStream as exc:
            raise Halt(OwnershipLost(run.execution_id, str(exc))) from None
        except Exception as exc:  # refused (stale fence: taken over) or the database failed: stop the run
            raise Halt(exc) from None
        if settle is not None:
            self.let_go = True
        if settle is not None and settle.released:
            self.released = True
        if fresh:
            self.state.meta.setdefault("$version", run.version)  # as the bootstrap stamped it (writer.stamp_version)
            if run.lease is not None:
                self.claim = get_ownership().begin(run.execution_id, run.token, fresh=True, lease=run.lease)
            else:
                self.claim = get_ownership().begin(run.execution_id, run.token, fresh=True)
        if self.every is not None:
            checkpoint(self.state)

    def secrets(self, step: str | None = None) -> list[str] | None:
        """The marked values this run holds in clear (its input's, its marked steps' results), longest first,
        for cutting out of failure text; None when the run holds no marked data (`step`: the failing one)."""
        return marked_values(self.state, step)

    def boundary(self) -> None:
        """A step boundary: stop if the claim was lost."""
        if self.claim is not None and self.claim.lost:
            raise Halt(OwnershipLost(self.run.execution_id, "its ownership claim was lost"))

    def before_work(self) -> None:
        """Before a step runs or a wait begins: the claim holds, the process is not shutting down, and the
        execution's deadline has not passed (DeadlineExceeded: the flow may catch it; uncaught, the execution
        fails)."""
        self.boundary()
        self.yield_if_draining()
        deadline = self.state.meta.get("$deadline")
        if deadline and not self.deadline_signalled and now() >= parse_time(deadline):
            # Raised once per run, at the first new work past the deadline (the same point on every
            # replay): a flow that catches it may run its handler's steps and waits.
            self.deadline_signalled = True
            raise DeadlineExceeded(f"deadline exceeded: execution {self.run.execution_id!r} passed its deadline "
                                   f"{deadline}")

    def yield_if_draining(self) -> None:
        """A graceful shutdown (the claim says `draining`): the step that just finished is recorded, then the run
        stops here, before new work; the claim's `abandon()` hands the lease back (leases/keeper.py) so another
        worker continues at once. Never at a settle: a run that finished settles as usual."""
        claim = self.claim
        if claim is not None and getattr(claim, "draining", False):
            if self.pending:
                self.flush()
            self.yielded = True  # its work is recorded: the claim's abandon(graceful=True) says so
            raise Halt(ShuttingDown(self.run.execution_id))

    def cap(self, due):
        """A wait's due time, no later than the execution's deadline (so a waiting execution wakes to
        fail at it, on any worker)."""
        deadline = self.state.meta.get("$deadline")
        if not deadline or self.deadline_signalled:
            return due
        deadline = parse_time(deadline)
        return deadline if due is None or deadline < due else due

    # -- what the wait primitives of DurableContext need (journal/flows/waits.py) --
    def take_message(self, pos: int, name: str, topic: str) -> tuple[Any] | None:
        """Consume the oldest pending message of `topic` and record it as the wait's result, in ONE
        transaction (exactly once: a crash before the commit leaves both undone); (payload,) or None. The engine's
        own: the messages' store is asked, and nothing of waits calls back into the run."""
        store = store_for(Event.objects.db)  # the run's shard (bound)
        eid = self.run.execution_id
        while True:
            found = store.pending_message(eid, topic)
            if found is None:
                return None
            row_id, message_id, payload = found
            with atomic(Event.objects.db):
                if not store.consume_message(row_id, self.run.tip + len(self.pending) + 1, now()):
                    continue  # consumed by a run that took over since (this one's write is refused next)
                self.emit(ev.STEP_COMPLETED, {"step": name, "pos": pos, "attempt": 1, "result": payload,
                                              "message_id": message_id, "ms": None})
                self.flush()  # a Halt here rolls the consumption back with it
            return (payload,)

    def put_event(self, key: str, value: Any) -> None:
        waits.put_event(self.run.execution_id, key, value)

    def spawn_child(self, flow: str, stored: Any, child_id: str) -> str:
        return waits.spawn_child(self.run.execution_id, flow, stored, child_id)

    def child_outcome(self, child_id: str) -> tuple[dict | None, str]:
        return waits.child_outcome(child_id)

    def park(self, spec: WaitSpec) -> Outcome:
        """Write what is pending, then the wait row and status waiting (the writer's); the thread and lease go."""
        if self.pending:
            self.flush()
        if not writer.park(self.run, spec):
            raise Halt(OwnershipLost(self.run.execution_id, "another run took it over before it could park"))
        self.let_go = True
        return Outcome(self.run.execution_id, "waiting", None, None)

    def check_start(self) -> None:
        """A scheduled start (start_at, delay, a child, a continuation, a fork) runs no step before its
        time: park (or sleep, if short) until then."""
        remaining = self.start_pause()
        if remaining > 0:
            time.sleep(remaining)

    def start_pause(self) -> float:
        """check_start's decision: the seconds to sleep in-process before the first step (0: none), or Park. A run
        driven from the loop (Runner.adrive) sleeps them there, holding no thread."""
        meta = self.state.meta
        start_at = meta.get("$start_at")
        if not start_at or self.state.steps or meta.get("$woken"):
            return 0.0
        remaining = (parse_time(start_at) - now()).total_seconds()
        if remaining <= 0:
            return 0.0
        self.before_work()  # woken at its deadline before its start time: it fails, not parks again
        if remaining >= inline_max():
            raise Park(WaitSpec("start", -1, self.cap(parse_time(start_at))))
        return remaining

    def after_settle(self) -> None:
        """A run that waited drops its wait row (best effort: a stale row is deleted by the next claim).
        A child's settle woke its parent already, in its own transaction (flush)."""
        waits.after_settle(self.state)

    def atomic_step(self, name: str, pos: int, attempt: int, began: float, fn, args,
                    timeout: float | None = None) -> Any:
        """Run fn and write its STEP_COMPLETED in one transaction: its database effects and the record
        that it completed commit together, or neither does."""
        # On the execution's shard (the bound alias): its effects commit with its record only on that database.
        with atomic(Event.objects.db):
            result = fn(*args)
            problem = _jsonable(result)
            if problem is not None:
                raise StepFailed(name, pos, problem, attempt)
            if timeout is not None and time.perf_counter() - began > timeout:
                raise DeadlineExceeded(f"deadline exceeded: step {name!r} took longer than its timeout of {timeout} s")
            self.emit(ev.STEP_COMPLETED, {"step": name, "pos": pos, "attempt": attempt, "result": result,
                                          "ms": round((time.perf_counter() - began) * 1000, 3)})
            self.flush()
        return result

    def drive(self, flow: Flow, value: Any) -> Outcome:
        """Run the flow to its outcome in this thread. An async flow under an awaitable face (aio.astart,
        aresume) is handed back to the loop instead (aio.hand_back): Runner.adrive drives it there."""
        if aio.is_async(flow.fn) and aio.hand_back(self, flow, value):
            return aio.HANDED_BACK
        return self._drive(flow, value)

    @telemetry.traced_run  # a span per run (attempt) of the execution when tracing is on
    def _drive(self, flow: Flow, value: Any) -> Outcome:
        asynchronous = aio.is_async(flow.fn)  # an `async def` flow: its code on the loop, its journal here
        ctx = (aio.AsyncDurableContext if asynchronous else DurableContext)(self, self.state, flow.retry)
        try:
            try:
                self.check_start()
                result = aio.run_flow(ctx, flow, value) if asynchronous else flow.fn(ctx, value)
                self.returned(ctx, flow, result)
            except BaseException as exc:
                return self.ended(ctx, flow, exc)
            return self.completed(result)
        except Halt as halt:
            return self.halted(halt)
        finally:
            self.let_claim_go()

    @aio.traced  # the same span (and count) per run as traced_run gives _drive, when tracing is on
    async def adrive(self, flow: Flow, value: Any) -> Outcome:
        """`_drive` of an async flow from the loop (aio.astart, aresume, a worker's async queue runs): the same
        decisions in the same order, each journal call in a thread of aio's pool, so nothing holds a thread
        between them: an in-process wait (a short sleep, a short scheduled start) is slept on the loop."""
        ctx = aio.AsyncDurableContext(self, self.state, flow.retry)
        try:
            try:
                if self.state.meta.get("$start_at"):  # else start_pause decides nothing: no pool call for it
                    pause = await aio.in_pool(self.start_pause)
                    if pause > 0:
                        await aio.nap(pause)
                result = await aio.run_here(ctx, flow, value)
                self.returned(ctx, flow, result)
            except BaseException as exc:
                return await aio.in_pool(self.ended, ctx, flow, exc)
            return await aio.in_pool(self.completed, result)
        except Halt as halt:
            return await aio.in_pool(self.halted, halt)
        finally:
            if self.claim is not None:  # a claim may touch its lease row: in the pool
                await aio.in_pool(self.let_claim_go)

    # -- the settle decisions of a run, shared by _drive and adrive --
    def returned(self, ctx: DurableContext, flow: Flow, result: Any) -> None:
        """The flow returned: the log holds no step it did not ask for, and its result is storable (no I/O)."""
        ctx.check_consumed()
        problem = _jsonable(result)
        if problem is not None:
            raise TypeError(f"flow {flow.name} returned a value that is not storable: {problem}")

    def ended(self, ctx: DurableContext, flow: Flow, exc: BaseException) -> Outcome:
        """The flow's code (or `returned`) raised: park, continue as new, or fail; a Halt is raised on."""
        if isinstance(exc, Park):
            return self.park(exc.spec)
        if isinstance(exc, ContinueAsNew):
            return self.continued(ctx, flow, exc)
        if isinstance(exc, Halt):
            raise exc
        # SystemExit, KeyboardInterrupt too: the flow failed (context.CONTROL)
        secrets = self.secrets()
        error = _error_text(exc, secrets)
        self.boundary()
        return self.settle(ev.EXECUTION_FAILED, {"error": error, **exit_trace(exc, secrets)}, "failed", None, error)

    def completed(self, result: Any) -> Outcome:
        self.boundary()
        return self.settle(ev.EXECUTION_COMPLETED, {"result": result}, "completed", result)

    def continued(self, ctx: DurableContext, flow: Flow, exc: ContinueAsNew) -> Outcome:
        """continue_as_new: the next run is written in the transaction of this run's settle, so a run fenced off
        meanwhile (a cancel took it) leaves no next run behind to run unowned; a next run refused fails this one."""
        ctx.check_consumed()
        self.boundary()
        try:
            with atomic(Event.objects.db):  # the run's shard (bound): the next run is placed with its root
                next_id = waits.continue_run(self.state, flow, exc.input)
                result = {"continued_as": next_id}
                self.continued_to = next_id
                outcome = self.settle(ev.EXECUTION_CONTINUED, {"next": next_id, "result": result}, "completed",
                                      result, after=False)
        except (InvalidInput, ExecutionExists) as refused:
            error = _error_text(refused)
            return self.settle(ev.EXECUTION_FAILED, {"error": error}, "failed", None, error, after=False)
        self.after_settle()  # after the commit (best effort), as every settle
        return outcome

    def settle(self, type_: str, payload: dict, status: str, result: Any = None, error: str = "",
               after: bool = True) -> Outcome:
        """THE end of a run that settles: its last event and the header's terminal state in one writer pass
        (with what the settle owes a parent or the next run), then its wait row dropped (`after`)."""
        self.emit(type_, payload)
        self.flush(writer.Settle(status, result, error))
        if after:
            self.after_settle()
        return Outcome(self.run.execution_id, status, result, None if status == "completed" else error)

    def halted(self, halt: Halt) -> Outcome:
        outcome = _halted(self.run.execution_id, halt.error)  # raises unless a cancel took the execution over
        # Cancelled under us: no run holds the execution any more, so its lease is released (not left
        # to lapse: the recovery sweep only looks at running executions, so a lapsed row stayed forever).
        self.let_go = True
        return outcome

    def let_claim_go(self) -> None:
        """The run is over in this process: its claim ends (released, handed back, or left to lapse)."""
        if self.claim is not None:
            if self.released:
                self.claim.end(released=True)
            elif not self.let_go and hasattr(self.claim, "abandon"):
                # Still running: its lease lapses and recovery takes it over; a run that stopped at a step
                # boundary for a graceful shutdown says so (its takeover is no recovery attempt).
                if self.yielded:
                    self.claim.abandon(graceful=True)
                else:
                    self.claim.abandon()
            else:
                self.claim.end()


_exists = writer.exists_error  # the ExecutionExists of a refused bootstrap (journal/flows/writer.py)


def _halted(execution_id: str, error: Exception) -> Outcome:
    """A run stopped: a cancel that took over is an outcome; anything else is raised. The header is read on
    the run's shard (bound for the whole run)."""
    if isinstance(error, OwnershipLost) or _is_stale(error):
        header = store_for(Event.objects.db).execution_status(execution_id)
        if header is not None and header[0] == CANCELLED:
            return Outcome(execution_id, CANCELLED, None, header[3] or "cancelled")
        if not isinstance(error, OwnershipLost):
            error = OwnershipLost(execution_id, f"another run took over ({error})")
    raise error


def _is_stale(error: Exception) -> bool:
    return isinstance(error, StaleFence)


# QUEUE_STARTS (the queues app's enqueue: start(..., queue=...) hands the start to it), RERUN_HOOKS and
# CANCEL_HOOKS are seams of journal/flows/plugins.py, filled from the other apps' ready(): the journal names
# no app above it. prepare_start (journal/flows/registry.py) is named here for the callers that knew it here.


def start(flow: str | Flow, input: Any, execution_id: str | None = None, meta: dict | None = None, *,
          start_at=None, delay: float | None = None, timeout: float | None = None, queue: str | None = None,
          partition_key: str | None = None, priority: int = 0, dedup_id: str | None = None) -> Outcome:
    """Start a durable execution and run it to completion in this thread.

    With no id a ULID is minted; a caller-chosen id makes the start idempotent: a second start of
    the same id (even racing from another process) raises ExecutionExists before any step runs.

    start_at (an aware datetime) or delay (seconds): a scheduled start; the execution is written and
    parked (Outcome status "waiting") and a worker's waker runs it when due. timeout (seconds): the
    execution's deadline; past it, the next step or wait raises DeadlineExceeded and the execution
    fails (a waiting execution is woken at its deadline, on any worker).

    queue (and partition_key, priority, dedup_id): the start is queued on that queue (the queues app,
    docs/queues.md) and a loom_worker runs it within the queue's caps; Outcome status "queued", with the
    execution id (the existing one when dedup_id matched a live entry). The execution exists at once
    (status queued: it can be shown, cancelled, messaged). start_at/delay become the entry's not-before
    time; timeout the execution's deadline, from now.
    """
    if queue is not None:
        return _queued_start(flow, input, execution_id, meta, queue, start_at, delay, timeout,
                             partition_key, priority, dedup_id)
    if partition_key is not None or priority or dedup_id is not None:
        raise InvalidInput("partition_key, priority and dedup_id are options of a queued start: give queue= too")
    # A queued start's input was sealed before it went to the broker (leases/tasks.py), with the subject's key of
    # the execution's shard (data keys live per shard): it is unsealed there. One without an id (or with an id
    # that prepare_start refuses) has no shard of its own: it is read unbound, as before.
    sealed = input if isinstance(input, Sealed) else None
    if sealed is not None and not _placeable(execution_id):
        input = unseal_started(sealed)
    if execution_id is None:
        execution_id = registry.new_execution_id()
    # The execution's shard is asked for ONCE, here: everything below (the unseal, the bootstrap or the scheduled
    # write, the run, its lease, its header reads) works on it through the binding. A refused id is not placed.
    with shards.on_stream(execution_id) if _placeable(execution_id) else nullcontext():
        if sealed is not None and input is sealed:
            input = unseal_started(sealed)
        due = _start_due(start_at, delay)
        extra = {}
        if timeout is not None:
            extra["$deadline"] = iso(now() + timedelta(seconds=check_seconds(timeout, "timeout")))
        definition, value, stored, execution_id = prepare_start(flow, input, execution_id)
        if due is not None:
            if meta:
                extra["$meta"] = meta
            return waits.schedule_here(definition.name, stored, execution_id, due, extra)
        return _start(definition, value, stored, execution_id, meta, sealed, extra)


def _placeable(execution_id: Any) -> bool:
    """An id shard_for can place (prepare_start refuses the others with its own error, unplaced)."""
    return isinstance(execution_id, str) and bool(execution_id) and "\x00" not in execution_id


def _start(definition: Flow, value: Any, stored: Any, execution_id: str, meta: dict | None,
           sealed: Sealed | None = None, extra: dict | None = None) -> Outcome:
    extra = extra or {}
    state = ExecutionState(execution_id)
    runner = Runner(writer.RunHandle(execution_id, definition.name, stored), state, None)
    if sealed is not None and sealed.get("flow") != definition.name:
        raise InvalidInput(f"a sealed input of flow {sealed.get('flow')!r} cannot start {definition.name!r}")
    # A queued input was sealed for the broker before its stream was written (unbound, version 1): the log's
    # copy is sealed by the write path, bound to the execution's stream (journal/privacy/codec.py, version 2).
    started = {"flow": definition.name, "input": stored, **extra}
    if meta:
        started["$meta"] = meta  # who started it and under which trace (the HTTP API records these)
    runner.emit(ev.EXECUTION_STARTED, started)
    state.input = stored  # the run's own copy in clear (failure text is cut by its marked values), never written
    return runner.drive(definition, value)


def _start_due(start_at, delay):
    """When a scheduled start is due (an aware datetime), from start_at or delay; None: now, not scheduled."""
    if start_at is not None and delay is not None:
        raise InvalidInput("start() takes start_at or delay, not both")
    if start_at is not None:
        return check_moment(start_at, "start_at")
    if delay is not None:
        return now() + timedelta(seconds=check_seconds(delay, "delay"))
    return None


def _queued_start(flow, input, execution_id, meta, queue, start_at, delay, timeout, partition_key, priority,
                  dedup_id) -> Outcome:
    """start(..., queue=...): an entry on the queue, nothing run here (checked and written by the queues app)."""
    if not QUEUE_STARTS:
        raise InvalidInput("start(queue=...) needs the queues app in INSTALLED_APPS (docs/queues.md)")
    run_after = _start_due(start_at, delay)
    queued = QUEUE_STARTS[0](flow, input, queue, execution_id=execution_id, partition_key=partition_key,
                             priority=priority, dedup_id=dedup_id, run_after=run_after, meta=meta, timeout=timeout)
    return Outcome(queued.execution_id, "queued")


def seal_started(flow: str, stored: Any) -> Any:
    """The input of a start to be queued, as the broker may keep it: a flow whose input has marked fields gets
    its EXECUTION_STARTED payload sealed now (a `Sealed`, which `start` writes as it is); others as given."""
    if ev.EXECUTION_STARTED not in marking.MARKED or not marking.fields_for(ev.EXECUTION_STARTED, {"flow": flow}):
        return stored
    return codec.seal_payload(store_for(Event.objects.db), ev.EXECUTION_STARTED, {"flow": flow, "input": stored})


def unseal_started(sealed: Sealed) -> Any:
    """The input a `seal_started` payload holds, as the system reads it (FORGOTTEN for a forgotten subject)."""
    return codec.unseal(store_for(Event.objects.db), ev.EXECUTION_STARTED, sealed).get("input")


def _take_over(execution_id: str, expected_fence: int | None = None,
               busy: bool = False) -> tuple[int, ExecutionState]:
    """A new fence first (every older owner is refused from here on), then the state.

    expected_fence: advance only from that token (a handed-over resume: if anyone took the
    execution over since it was handed over, nothing is done). A parked execution (waiting or
    suspended) is running again from the same transaction on (its header locked first, the order
    of park and send)."""
    store = store_for(Fence.objects.db)
    try:
        with atomic(Fence.objects.db):
            status = store.lock_execution(execution_id)
            token = Fence.objects.advance(execution_id, expected_fence)
            if status in PARKED:
                store.set_execution_status(execution_id, token, RUNNING)
    except UnknownStream:
        raise UnknownExecution(execution_id) from None
    except StaleFence:
        if busy:  # a run took it over since the liveness check (a waker's claim): it is live now
            raise ExecutionBusy(execution_id, f"a run that took it over after fence {expected_fence}") from None
        raise NotResumable(f"execution {execution_id!r} was taken over since fence {expected_fence} "
                           f"(now {Fence.objects.current(execution_id)}); nothing done") from None
    return token, load_state(execution_id)


PARKED = frozenset({"waiting", "suspended"})


def _adopt(execution_id: str, token: int) -> ExecutionState:
    """The state under a fence token a takeover already obtained (the recovery sweep's): no second
    advance. NotResumable if the fence moved on since (someone took the execution over after it)."""
    current = Fence.objects.current(execution_id)
    if current is None:
        raise UnknownExecution(execution_id)
    if current != token:
        raise NotResumable(f"execution {execution_id!r} was taken over since fence {token} (now {current}); "
                           f"nothing done")
    return load_state(execution_id)


def header_of(execution_id: str) -> tuple[str, str, Any, str]:
    """(status, flow, result, error) of an execution's header; UnknownExecution if it has none (a
    stream without a header, such as an aggregate's, is not an execution and is never fenced)."""
    header = writer.header_status(execution_id)
    if header is None:
        raise UnknownExecution(execution_id)
    return header


def check_not_live(execution_id: str) -> None:
    """ExecutionBusy if another process provably drives the execution (ownership.live_owner)."""
    holder = ownership.live_owner(execution_id)
    if holder is not None:
        raise ExecutionBusy(execution_id, holder)


@shards.by_stream
def resume(execution_id: str, *, force: bool = False, expected_fence: int | None = None,
           token: int | None = None) -> Outcome:
    """Continue an execution whose owner died: take a new fence, replay the log, run the rest, in
    this thread (an operator hands it to a worker instead: journal.flows.hand_over).

    Checked before anything is taken over, so a refusal changes nothing: the execution exists (a
    header), its flow is registered in this process (UnknownFlow), and nobody else drives it now
    (ExecutionBusy: a live lease, or a fresh run within its lazy grace; `force=True` takes it over
    anyway, and the run it fences off stops at its next step boundary, its in-flight step may run
    twice). A settled execution is not run again: its outcome is returned. NonDeterminism if the
    code asks for a different step than the log recorded (nothing is written then).

    token (internal: the leases recovery sweep): the fence token its takeover already advanced to;
    the run goes on under it instead of advancing the fence again, and NotResumable if the fence has
    moved on since. The checks above run all the same.
    """
    if token is not None and expected_fence is not None:
        raise ValueError("resume() takes expected_fence (advance from it) or token (already advanced), not both")
    status, flow_name, _, _ = header_of(execution_id)
    if status in TERMINAL:
        state = load_state(execution_id)
        if state.settled:
            return Outcome(execution_id, state.status, state.result, state.error or None)
    # UnknownFlow before anything is taken over: the flow AND the version the execution started on (a
    # process without that version leaves it to a worker that has it, docs/flows.md "Versions"). A
    # takeover's token (the sweep, the waker) was claimed by version in SQL already: no read for it.
    if token is None:
        get_flow(flow_name, header_version(execution_id))
    busy = False
    if not force:
        if token is None and expected_fence is None:
            # Advance only from the fence the liveness check saw: a waker's claim (or any takeover)
            # between the check and the header lock makes the advance refuse (ExecutionBusy) instead of
            # fencing off the run it just woke.
            expected_fence, busy = Fence.objects.current(execution_id), True
        check_not_live(execution_id)
    if token is None:
        token, state = _take_over(execution_id, expected_fence, busy)
    else:
        state = _adopt(execution_id, token)
    if state.settled:
        return Outcome(execution_id, state.status, state.result, state.error or None)
    definition = get_flow(flow_name, started_on(state))
    value, _ = definition.prepare(state.input, check_json=False)
    run = writer.RunHandle(execution_id, definition.name, state.input, token=token, tip=state.seq)
    claim = get_ownership().begin(execution_id, token, fresh=False)
    runner = Runner(run, state, claim)
    runner.recovered = {"by": process_identity(), "fence": token}
    if status == "suspended":  # the log says who let it go on (written with the run's next write)
        runner.emit(ev.EXECUTION_RESUMED, {"by": process_identity(), "from_status": status})
    return runner.drive(definition, value)


def header_version(execution_id: str) -> int:
    """The header's flow_version (the version the execution started on); 1 if it has no header."""
    found = Execution.objects.filter(pk=execution_id).values_list("flow_version", flat=True).first()
    return 1 if found is None else found


def started_on(state: ExecutionState) -> int:
    """The flow version an execution started on (EXECUTION_STARTED `$version`; 1 before versions existed):
    the only version it is ever replayed on (docs/flows.md "Versions")."""
    return int(state.meta.get("$version") or 1)


def process_identity() -> str:
    """Who this process is in the log: LOOM_WORKER_ID, or host:pid (the lease keeper's default too)."""
    return node_identity()


def _retry_view(execution_id: str) -> tuple[int | None, tuple[str, str, Any, str]]:
    """(fence token, header) as a retry sees them before deciding: the fence read first, so a header
    read as failed was failed at that fence or later (a retry that committed since moved the fence)."""
    fence = Fence.objects.current(execution_id)
    return fence, header_of(execution_id)


@shards.by_stream
def retry(execution_id: str, *, actor: Any = None, handoff: bool = False) -> Outcome:
    """A new attempt of a FAILED execution, from its last completed step, recorded in its log.

    Takes a new fence, writes EXECUTION_RETRIED {attempt, actor, error, from_pos, steps} and puts
    the header back to running in one transaction; the failed step (if the flow failed in a step)
    runs again with a fresh set of attempts, completed steps are replayed from the log. Then the
    run goes on in this thread (returns its outcome, like resume), or with `handoff=True` is queued
    for a worker (journal.flows.hand_over; returns Outcome(status "running") at once). `actor` (who
    asked; JSON, else its str) is recorded in the event. NotResumable unless the execution failed.
    """
    fence, (status, flow_name, _, _) = _retry_view(execution_id)
    if status != SETTLED_FAILED:
        raise NotResumable(f"execution {execution_id!r} is {status}; only a failed execution can be retried")
    # A worker needs the code (the version the execution started on); this process may not. Checked before
    # anything is written: a retry that cannot run here is refused whole.
    definition = None if handoff else get_flow(flow_name, header_version(execution_id))
    if handoff:
        check_queue()  # before anything is written: a retry nobody will run is worse than none
    try:
        # One transaction from the fence advance to the header update, the advance guarded by the fence
        # read with the header: a retry that lost the race (another took the fence since it read the
        # header as failed) is refused by the advance itself, or rolled back with it: a refusal changes
        # nothing, so the winner's handed-over resume (expected_fence=its token) still runs.
        with atomic(Event.objects.db):
            token, _ = _take_over(execution_id, fence)
            # The whole log, not a snapshot: a settled checkpoint keeps no step records, a retry needs them.
            events = Event.objects.read(execution_id)
            state = ExecutionState(execution_id)
            for event in events:
                state.apply(event.seq, event.type, event.payload)
            if state.status != SETTLED_FAILED:
                raise NotResumable(f"execution {execution_id!r} is {state.status}; "
                                   f"only a failed execution can be retried")
            snapshot = Snapshot.objects.latest(execution_id)
            state.snapshot_seq = -1 if snapshot is None else snapshot.seq
            steps = state.steps
            from_pos = len(steps) - 1 if steps and steps[-1][1] == FAILED_STEP else len(steps)
            attempt = 2 + sum(1 for event in events if event.type == ev.EXECUTION_RETRIED)
            payload = {"attempt": attempt, "actor": actor if _jsonable(actor) is None else str(actor),
                       "error": state.error, "from_pos": from_pos, "steps": steps[:from_pos]}
            appended = Event.objects.append(execution_id, Envelope(ev.EXECUTION_RETRIED, payload), fence_token=token,
                                            expected_seq=state.seq)
            # The header goes back to running in the same transaction as its event (a rare operator
            # action: the ORM's one UPDATE, not a hot-path statement).
            Execution.objects.filter(pk=execution_id).update(status=RUNNING, result=None, error="", finished_at=None,
                                                             updated_at=Now())
            for hook in RERUN_HOOKS:  # e.g. the queues app: the execution takes its queue slot back
                hook(execution_id, Event.objects.db)
    except (StaleFence, SequenceConflict):  # another retry (or resume) took the fence after us: it wins
        raise NotResumable(f"execution {execution_id!r} was taken over while it was being retried; "
                           f"nothing written") from None
    state.apply(appended.last_seq, ev.EXECUTION_RETRIED, payload)
    if handoff:
        enqueue_resume(execution_id, token)
        return Outcome(execution_id, RUNNING, None, None)
    value, _ = definition.prepare(state.input, check_json=False)
    run = writer.RunHandle(execution_id, definition.name, state.input, token=token, tip=state.seq)
    claim = get_ownership().begin(execution_id, token, fresh=False)
    return Runner(run, state, claim).drive(definition, value)


@shards.by_stream
def cancel(execution_id: str, reason: str = "cancelled") -> Outcome:
    """Cancel an execution: take its fence (a running owner is refused at its next step boundary and
    stops) and record EXECUTION_CANCELLED. Cancelling a cancelled execution returns its outcome;
    a completed or failed one raises NotResumable. An execution that continued as new is cancelled in
    the newest run of its chain (the id a caller knows stands for the whole chain, as for send())."""
    header = writer.header_status(execution_id)
    if header is not None and waits._continued(header):
        current = waits.chain_current(execution_id)
        if current != execution_id:
            return cancel(current, reason)
    token, state = _take_over(execution_id)
    if state.settled:
        if state.status == CANCELLED:
            return Outcome(execution_id, CANCELLED, None, state.error or "cancelled")
        raise NotResumable(f"execution {execution_id!r} already {state.status}; it cannot be cancelled")
    reason = str(reason or "cancelled")[:2000]
    run = writer.RunHandle(execution_id, state.flow, state.input, token=token, tip=state.seq)
    runner = Runner(run, state, None)
    runner.emit(ev.EXECUTION_CANCELLED, {"reason": reason})
    # Its children: those whose start completed, and (a run that died while starting one) the
    # default id of a start not recorded as completed.
    children = [record[2] if record[1] == COMPLETED else f"{execution_id}.child-{pos}"
                for pos, record in enumerate(state.steps) if record[0] == "$start_child"]
    try:
        with atomic(Event.objects.db):  # the settle and the hooks' writes commit together, or neither
            runner.flush(writer.Settle(CANCELLED, None, reason))
            for hook in CANCEL_HOOKS:  # e.g. the leases app: the lease row of the run it fenced off goes
                hook(execution_id, Event.objects.db)
    except Halt as halt:
        raise halt.error from None
    runner.after_settle()
    cancel_children(execution_id, children, reason)
    return Outcome(execution_id, CANCELLED, None, reason)


def cancel_children(parent_id: str, children: list[str], reason: str) -> None:
    """The policy: cancelling a parent cancels each child it started that has not settled (and theirs).
    Only a child whose log names this execution as its `$parent` is cancelled (never another
    execution's child), and a child that continued as new is cancelled in the newest run of its chain."""
    for child in children:
        if waits._started_payload(child).get("$parent") != parent_id:
            continue  # not started by this execution (or never written)
        link = waits.chain_current(child)
        while True:
            try:
                cancel(link, f"parent {parent_id} cancelled: {reason}"[:2000])
            except UnknownExecution:
                break
            except NotResumable:  # settled: if it continued meanwhile, the run it continued as is next
                pass
            current = waits.chain_current(link)
            if current == link:
                break
            link = current




@shards.by_stream
def suspend(execution_id: str, *, force: bool = False, reason: str = "") -> Outcome:
    """Suspend an execution: a new fence, EXECUTION_SUSPENDED in its log, status suspended, its wait
    row dropped: no lease, no worker, nothing wakes it until resume() (or hand_over) on any worker.

    A run that a live owner drives is refused (ExecutionBusy) unless `force` (the run is fenced off
    and stops at its next step boundary). Settled: ExecutionFinished. Suspended already: its outcome."""
    status = header_of(execution_id)[0]
    if status in TERMINAL:
        raise ExecutionFinished(execution_id, status, "suspend")
    if status == waits.SUSPENDED_STATUS:
        return Outcome(execution_id, waits.SUSPENDED_STATUS, None, None)
    seen = None
    if not force:
        # The fence as the liveness check saw it: the advance below is only from it, so a run a waker
        # claimed (or anyone took over) between the check and the header lock is refused, not fenced off.
        seen = Fence.objects.current(execution_id)
        check_not_live(execution_id)
    store = waits._store()
    try:
        with atomic(waits._alias()):
            status = store.lock_execution(execution_id)
            if status in TERMINAL:
                raise ExecutionFinished(execution_id, status, "suspend")
            token = Fence.objects.advance(execution_id, seen)
            state = load_state(execution_id)
            Event.objects.append(execution_id, Envelope(ev.EXECUTION_SUSPENDED, {
                "by": process_identity(), "reason": str(reason or "")[:2000]}), fence_token=token,
                expected_seq=state.seq)
            store.set_execution_status(execution_id, token, waits.SUSPENDED_STATUS)
            store.drop_wait(execution_id)
    except UnknownStream:
        raise UnknownExecution(execution_id) from None
    except StaleFence:
        if not force:
            raise ExecutionBusy(execution_id, "a run that took it over after the liveness check") from None
        raise NotResumable(f"execution {execution_id!r} was taken over while being suspended; "
                           f"nothing written") from None
    return Outcome(execution_id, waits.SUSPENDED_STATUS, None, None)




def wake_due(limit: int | None = None, alias: str | None = None) -> list[Outcome]:
    """Claim the due waits of the flows registered here and run each in THIS thread (tests, an
    embedding, a cron); the worker's waker does the same in a pool. Every shard (up to `limit` each),
    or `alias` only; a shard that is down is skipped (logged) and the others go on."""
    flows = registry.runnable()  # (flow, version): the waits of versions this process has
    if not flows:
        return []
    claimed = []
    for one in [alias] if alias is not None else shards.shards():
        try:
            claimed += store_for(one).claim_due_waits(now(), limit or conf.get("LOOM_WAIT_BATCH"), flows)
        except DatabaseError:
            if alias is not None or not shards.sharded():
                raise
            log.exception("wake_due: the due waits of shard %s could not be claimed; the others go on", one)
            connections[one].close()
    outcomes = []
    for item in claimed:
        try:
            # force: the claim itself took the execution over (its fence moved from the parked run's
            # token), so a lease row the parked run has not handed back yet proves nothing.
            outcomes.append(resume(item.execution_id, token=item.token, force=True))
        except FlowError as exc:
            log.warning("woken execution %s not run: %s", item.execution_id, exc)
    return outcomes


@shards.by_stream
def outcome_of(execution_id: str) -> Outcome:
    """The outcome as the log says now (a bounded read); while it is not settled, running, or waiting /
    suspended / queued as its header says when it is parked or not begun."""
    state = load_state(execution_id)
    status = state.status
    if not state.settled:
        header = writer.header_status(execution_id)
        if header is not None and (header[0] in PARKED or header[0] == "queued"):  # the log cannot tell these
            status = header[0]
    return Outcome(execution_id, status, state.result, state.error or None)


retry_execution = retry  # exported as journal.flows.retry_execution (journal.flows.retry is the policy module)
