"""The replay check: recorded histories replayed against the code of this process, nothing written.

Before a deploy, the question is whether the new code can resume what the old code left in flight. A
replay answers it without running anything: each recorded history (an execution's log, read from the
database or from a file `export()` wrote) is folded as a resume folds it, then the flow's code (the
version the execution started on, as registered here) runs against it. Every recorded step returns its
recorded result; no step function, wait, message or child is touched; the replay stops at the first
thing the log has no record of (the part a resume would run anew). It fails where a resume would
fail before doing anything: `NonDeterminism` (another step at a recorded position, or the flow returning
before its recorded steps are used up), the flow or its version not registered, an input that no
longer validates, or the flow's code raising where the recorded execution did not fail.

    manage.py loom replay --last 20            # the newest 20 executions of each flow (CI, before a deploy)
    manage.py loom replay --file order-42.json # a history `manage.py loom executions export` wrote
    journal.flows.testing.replay(...)          # the same inside a test: AssertionError on the first failure
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any

from journal import shards
from journal.flows import aio
from journal.flows import events as ev
from journal.flows.context import ContinueAsNew, DurableContext, Halt, Park
from journal.flows.errors import FlowError, InvalidInput, NonDeterminism, StepFailed, UnknownExecution, UnknownFlow
from journal.flows.registry import get_flow
from journal.flows.state import SETTLED_FAILED, ExecutionState
from journal.models import Event, Execution

FORMAT = "loom-history/1"


class InvalidHistory(FlowError, ValueError):
    """A history file that is not one `export()` wrote (or was changed since): what is wrong with it."""


@dataclass(frozen=True, slots=True)
class History:
    """One execution's recorded log: (seq, type, payload) in seq order."""

    execution_id: str
    events: tuple[tuple[int, str, dict], ...]

    def to_json(self) -> dict:
        state = self.fold()
        return {"format": FORMAT, "execution_id": self.execution_id, "flow": state.flow,
                "version": _version(state), "status": state.status,
                "events": [{"seq": seq, "type": type_, "payload": payload} for seq, type_, payload in self.events]}

    @classmethod
    def from_json(cls, data: Any, source: str = "history") -> History:
        """A history from what `to_json` produced; InvalidHistory naming what is wrong (nothing else read)."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise InvalidHistory(f"{source}: not a Loom history (expected \"format\": {FORMAT!r})")
        eid, events = data.get("execution_id"), data.get("events")
        if not isinstance(eid, str) or not eid:
            raise InvalidHistory(f"{source}: \"execution_id\" must be a non-empty string")
        if not isinstance(events, list) or not events:
            raise InvalidHistory(f"{source}: \"events\" must be a non-empty list")
        rows = []
        for n, event in enumerate(events):
            if (not isinstance(event, dict) or not isinstance(event.get("seq"), int) or isinstance(event["seq"], bool)
                    or not isinstance(event.get("type"), str) or not isinstance(event.get("payload"), dict)):
                raise InvalidHistory(f"{source}: event {n} must be "
                                     f"{{\"seq\": int, \"type\": str, \"payload\": {{...}}}}")
            if event["seq"] != n:
                raise InvalidHistory(f"{source}: event {n} has seq {event['seq']} (a log is contiguous from 0)")
            rows.append((event["seq"], event["type"], event["payload"]))
        if rows[0][1] != ev.EXECUTION_STARTED:
            raise InvalidHistory(f"{source}: the first event is {rows[0][1]}, not {ev.EXECUTION_STARTED}")
        history = cls(eid, tuple(rows))
        try:  # the fold a replay starts from: an event without the fields its type has is no history of ours
            state = history.fold()
            int(state.meta.get("$version") or 1)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise InvalidHistory(f"{source}: its events do not fold into an execution ({type(exc).__name__}: "
                                 f"{exc})") from None
        if not isinstance(state.flow, str) or not state.flow:
            raise InvalidHistory(f"{source}: its {ev.EXECUTION_STARTED} names no flow")
        return history

    def fold(self) -> ExecutionState:
        """The state a resume would fold from this log (the whole log: no snapshot)."""
        state = ExecutionState(self.execution_id)
        for seq, type_, payload in self.events:
            state.apply(seq, type_, payload)
        return state


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """What replaying one history found. `ok`: a resume on this code would go on where the log ends."""

    execution_id: str
    flow: str
    version: int
    ok: bool
    replayed: int = 0  # recorded step positions the code asked for, in order, before the replay stopped
    position: int | None = None  # where it failed
    recorded: str | None = None
    requested: str | None = None
    reason: str = ""
    problem: str = ""  # the kind of failure: NonDeterminism, UnknownFlow, InvalidInput, raised

    def as_json(self) -> dict:
        return {"execution_id": self.execution_id, "flow": self.flow, "version": self.version, "ok": self.ok,
                "replayed": self.replayed, "position": self.position, "recorded": self.recorded,
                "requested": self.requested, "problem": self.problem or None, "reason": self.reason or None}

    def line(self) -> str:
        where = f"{self.execution_id} ({self.flow} v{self.version})"
        if self.ok:
            return f"ok    {where}: {self.replayed} recorded step(s) replayed"
        at = "" if self.position is None else f" at position {self.position}"
        return f"FAIL  {where}{at}: {self.reason}"


class _ReplayEnd(BaseException):
    """The code reached what the log has no record of: a resume would run the rest anew. A BaseException,
    as Halt, so a flow's `except Exception` cannot swallow it."""


@dataclass(slots=True)
class _Run:
    execution_id: str


class _ReplayRunner:
    """What DurableContext talks to, for a replay: nothing is ever written or run. Every recorded position
    is answered by the context from the folded state; anything else ends the replay (_ReplayEnd)."""

    def __init__(self, state: ExecutionState):
        self.state = state
        self.run = _Run(state.execution_id)

    def _end(self, *args: Any, **kwargs: Any) -> Any:
        raise _ReplayEnd

    emit = flush = before_work = take_message = put_event = spawn_child = child_outcome = atomic_step = _end

    def boundary(self) -> None:
        """No claim to lose."""

    def cap(self, due):
        return due

    def secrets(self, step: str | None = None) -> list[str] | None:
        return None


def _version(state: ExecutionState) -> int:
    return int(state.meta.get("$version") or 1)


def replay_history(history: History) -> ReplayResult:
    """Replay one history against this process's code; never raises for what it finds (InvalidHistory aside)."""
    state = history.fold()
    eid, flow_name, version = history.execution_id, state.flow, _version(state)

    def failed(problem: str, reason: str) -> ReplayResult:
        reached = None if ctx is None else ctx._pos  # None: the code never ran
        return ReplayResult(eid, flow_name, version, False, 0 if reached is None else min(reached, len(state.steps)),
                            reached, problem=problem, reason=reason)

    ctx: DurableContext | None = None
    try:
        definition = get_flow(flow_name, version)
    except UnknownFlow as exc:
        return failed("UnknownFlow", str(exc))
    try:
        value, _ = definition.prepare(state.input, check_json=False)
    except InvalidInput as exc:
        return failed("InvalidInput", f"its recorded input no longer validates: {exc}")
    asynchronous = aio.is_async(definition.fn)  # an async flow replays the same way, its code on the loop
    ctx = (aio.AsyncDurableContext if asynchronous else DurableContext)(_ReplayRunner(state), state, definition.retry)
    try:
        with contextlib.suppress(ContinueAsNew):  # the flow ended this run: its records are checked all the same
            aio.run_flow(ctx, definition, value) if asynchronous else definition.fn(ctx, value)
        ctx.check_consumed()
    except _ReplayEnd:
        pass
    except Park:  # a wait the log recorded as begun: the resume parks again (nothing new)
        pass
    except Halt as halt:
        error = halt.error
        if isinstance(error, NonDeterminism):
            return ReplayResult(eid, flow_name, version, False, error.position, error.position, error.recorded,
                                error.requested, str(error), "NonDeterminism")
        return failed(type(error).__name__, str(error))
    except Exception as exc:
        # The recorded execution failed too (a recorded step failure re-raised, or its own error): the same end.
        if state.status != SETTLED_FAILED and not isinstance(exc, StepFailed):
            return failed("raised", f"the flow's code raised {type(exc).__name__}: {exc} where the recorded "
                                    f"execution did not fail")
    return ReplayResult(eid, flow_name, version, True, min(ctx._pos, len(state.steps)))


def history_of(execution_id: str) -> History:
    """The whole recorded log of one execution, from its shard (UnknownExecution if it has none)."""
    with shards.on_stream(execution_id):
        events = Event.objects.read(execution_id)
    if not events or events[0].type != ev.EXECUTION_STARTED:
        raise UnknownExecution(execution_id)
    return History(execution_id, tuple((e.seq, e.type, e.payload) for e in events))


def export(execution_id: str) -> str:
    """One execution's history as JSON text (`manage.py loom executions export`): what `replay_file` reads.
    It holds the payloads as the system reads them (a marked input in clear): keep the file as you would
    the data."""
    return json.dumps(history_of(execution_id).to_json(), indent=2, sort_keys=True, ensure_ascii=False)


def load_file(path: str) -> History:
    """A history file (InvalidHistory if it is not one)."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError) as exc:
        raise InvalidHistory(f"{path}: cannot be read as JSON: {exc}") from None
    return History.from_json(data, path)


#: Executions nothing replays again: resume returns a completed or cancelled one's outcome (a failed one is
#: replayed by retry, a fork replays its records into a new execution, so both stay in the default check).
NEVER_REPLAYED = ("completed", "cancelled")


def recent_ids(flows: list[str] | None = None, last: int = 20, settled: bool = False,
               aliases: list[str] | None = None) -> list[str]:
    """The ids of the newest `last` executions of each flow (`flows`; default: every flow with executions)
    that the new code may have to replay (running, waiting, suspended, stuck, failed); `settled`: completed
    and cancelled ones too (then the code must reproduce their whole log); on every shard (or `aliases`)."""
    ids: list[str] = []
    for alias in aliases if aliases is not None else shards.shards():
        rows = Execution.objects.using(alias)
        if not settled:
            rows = rows.exclude(status__in=NEVER_REPLAYED)
        names = flows if flows is not None else sorted(set(rows.order_by().values_list("flow", flat=True)))
        for name in names:
            ids += rows.filter(flow=name).order_by("-created_at", "id").values_list("id", flat=True)[:last]
    return ids


def replay(execution_ids: list[str] | None = None, *, flows: list[str] | None = None, last: int = 20,
           settled: bool = False, histories: list[History] | None = None) -> list[ReplayResult]:
    """Replay the given executions (by id) and histories, or else the newest `last` of each flow (`flows`,
    `settled` as in recent_ids); one result each, in that order. Nothing is written."""
    found = list(histories or [])
    ids = list(execution_ids or [])
    if not ids and not found:
        ids = recent_ids(flows, last, settled)
    found += [history_of(eid) for eid in ids]
    return [replay_history(history) for history in found]


__all__ = ["FORMAT", "History", "InvalidHistory", "ReplayResult", "export", "history_of", "load_file", "recent_ids",
           "replay", "replay_history"]
