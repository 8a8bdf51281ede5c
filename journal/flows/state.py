"""The folded state of an execution, checkpoints of it, and loading it with a bounded read.

The state is what a resume needs: the flow, its input, and per step position the recorded step
name, its status and result (or error) and its attempt. The runner folds every event it writes
into it as it goes (so a checkpoint costs no read), and `load_state` rebuilds it from the newest
snapshot plus the tail after it: two queries, and rows = 1 snapshot + the tail, never the whole log
once a snapshot exists.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from journal import conf, shards
from journal.flows import events as ev
from journal.flows.errors import UnknownExecution
from journal.privacy import marking

# Status of one step record (index 1 of a step record list).
STARTED, COMPLETED, FAILED, RETRYING = "started", "completed", "failed", "retrying"
# A wait primitive's record while it waits: [name, WAITING, {kind, due_at, topic?, child?, woken?}, 1].
WAITING = "waiting"

RUNNING, SETTLED_COMPLETED, SETTLED_FAILED, CANCELLED = "running", "completed", "failed", "cancelled"
TERMINAL = frozenset({SETTLED_COMPLETED, SETTLED_FAILED, CANCELLED})


@dataclass(slots=True)
class ExecutionState:
    """Folded state. steps[pos] = [name, status, result-or-error, attempt]; seq = last folded seq."""

    execution_id: str
    flow: str = ""
    input: Any = None
    status: str = RUNNING
    steps: list[list] = field(default_factory=list)
    result: Any = None
    error: str = ""
    seq: int = -1
    snapshot_seq: int = -1  # seq of the newest checkpoint (-1: none)
    # What EXECUTION_STARTED carried besides flow and input ($start_at, $deadline, $parent, $previous,
    # $root, $forked_from): a scheduled start, a deadline, the links of children and continuations.
    meta: dict = field(default_factory=dict)

    def apply(self, seq: int, type_: str, p: dict) -> None:
        """Fold one event (in seq order)."""
        if type_ == ev.STEP_STARTED:
            # A started record keeps the step's deadline (if it has a timeout) where a result goes.
            deadline = p.get("deadline")
            self._put(p["pos"], [p["step"], STARTED, {"deadline": deadline} if deadline else None,
                                 p.get("attempt", 1)])
        elif type_ == ev.STEP_COMPLETED:
            self._put(p["pos"], [p["step"], COMPLETED, p.get("result"), p.get("attempt", 1)])
        elif type_ == ev.STEP_FAILED:
            record = [p["step"], RETRYING if p.get("retry") else FAILED, p.get("error", ""), p.get("attempt", 1)]
            if p.get("due_at"):
                record.append(p["due_at"])  # a parked backoff: the next attempt not before then
            self._put(p["pos"], record)
        elif type_ == ev.EXECUTION_STARTED:
            self.flow, self.input, self.status = p.get("flow", ""), p.get("input"), RUNNING
            self.meta = {k: v for k, v in p.items() if k.startswith("$") and k not in ("$meta", "$steps")}
            if p.get("$steps"):  # a fork: the records it replays
                self.steps = [list(record) for record in p["$steps"]]
        elif type_ == ev.WAIT_STARTED:
            info = {k: p[k] for k in ("kind", "due_at", "topic", "child") if p.get(k) is not None}
            self._put(p["pos"], [p["step"], WAITING, info, p.get("attempt", 1)])
        elif type_ == ev.WAIT_WOKEN:
            pos = p.get("pos", -1)
            if 0 <= pos < len(self.steps) and self.steps[pos][1] == WAITING:
                self.steps[pos][2] = {**self.steps[pos][2], "woken": True}
            elif 0 <= pos < len(self.steps) and len(self.steps[pos]) > 4:
                self.steps[pos][4] = None  # a parked backoff ends now
            elif pos == -1:
                self.meta["$woken"] = True  # a scheduled start made due now
        elif type_ == ev.EXECUTION_CONTINUED or type_ == ev.EXECUTION_COMPLETED:
            self.status, self.result = SETTLED_COMPLETED, p.get("result")
        elif type_ == ev.EXECUTION_FAILED:
            self.status, self.error = SETTLED_FAILED, p.get("error", "")
        elif type_ == ev.EXECUTION_CANCELLED:
            self.status, self.error = CANCELLED, p.get("reason", "") or "cancelled"
        elif type_ == ev.EXECUTION_RETRIED:
            # A new attempt of a failed execution: running again, with the step records it replays
            # carried in the event itself (a settled checkpoint keeps no step records).
            self.status, self.result, self.error = RUNNING, None, ""
            self.steps = [list(record) for record in p.get("steps") or []]
        self.seq = seq

    def _put(self, pos: int, record: list) -> None:
        if pos == len(self.steps):
            self.steps.append(record)
        else:
            self.steps[pos] = record

    @property
    def settled(self) -> bool:
        return self.status in TERMINAL

    def to_json(self) -> dict:
        """The checkpoint. A settled execution keeps its outcome but not its step records: nothing
        replays a settled execution (resume returns its outcome), so loading it should not pay for
        parsing every step's result; describe() reads the log itself for the timeline."""
        steps = None if self.status in TERMINAL else self.steps
        return {"flow": self.flow, "input": self.input, "status": self.status, "steps": steps,
                "step_count": len(self.steps), "result": self.result, "error": self.error, "seq": self.seq,
                "meta": self.meta}

    @classmethod
    def from_json(cls, execution_id: str, data: dict, snapshot_seq: int) -> ExecutionState:
        return cls(execution_id, data["flow"], data["input"], data["status"], data["steps"] or [],
                   data["result"], data["error"], data["seq"], snapshot_seq, data.get("meta") or {})


def snapshot_every() -> int | None:
    return conf.get("LOOM_SNAPSHOT_EVERY")


@shards.by_stream
def load_state(execution_id: str) -> ExecutionState:
    """The newest snapshot, then only the events after it: two queries, a bounded number of rows."""
    from journal.models import Event, Snapshot  # app registry: state loads before it (journal.flows' face)

    snap = Snapshot.objects.latest(execution_id)
    if snap is None:
        state = ExecutionState(execution_id)
    else:
        state = ExecutionState.from_json(execution_id, snap.state, snap.seq)
    tail = Event.objects.read(execution_id, after_seq=state.seq)
    if snap is None and not tail:
        raise UnknownExecution(execution_id)
    for event in tail:
        state.apply(event.seq, event.type, event.payload)
    return state


def checkpoint(state: ExecutionState) -> bool:
    """Save a snapshot at state.seq if the tail since the last one reached LOOM_SNAPSHOT_EVERY."""
    every = snapshot_every()
    if every is None or state.seq - state.snapshot_seq < every:
        return False
    if _holds_marked(state):
        return False  # personal data (journal/privacy) is never checkpointed in clear: replay the log instead
    from journal.models import Snapshot  # app registry (as load_state)

    Snapshot.objects.save_state(state.execution_id, state.seq, state.to_json())
    state.snapshot_seq = state.seq
    return True


def _holds_marked(state: ExecutionState) -> bool:
    """Whether the state holds marked fields (journal/privacy): its flow's input, or a recorded step's result."""
    if not marking.MARKED:
        return False
    if marking.fields_for(ev.EXECUTION_STARTED, {"flow": state.flow}):
        return True
    return ev.STEP_COMPLETED in marking.MARKED and any(
        step and marking.fields_for(ev.STEP_COMPLETED, {"step": step[0]}) for step in state.steps)


def marked_values(state: ExecutionState, step: str | None = None) -> list[str] | None:
    """The marked values (journal/privacy) a run holds in clear, as text, longest first: its input's and its
    recorded marked steps' results; None when the run holds no marked data (nor is `step` a marked step).
    Failure text is cut by them (journal/flows/context.py). Values under 3 characters are not cut (they would
    cut words of the message, and say little alone)."""
    if not marking.MARKED or not (_holds_marked(state) or (
            step is not None and marking.fields_for(ev.STEP_COMPLETED, {"step": step}))):
        return None
    found: set[str] = set()

    def take(type_: str, payload: dict) -> None:
        for f in marking.fields_for(type_, payload):
            value = marking.get(payload, f.path)
            if f.subject is None or value is None:
                continue
            texts = {value if isinstance(value, str) else json.dumps(value, ensure_ascii=False), str(value)}
            stack = [value]
            while stack:  # the leaves of a marked object or list too
                node = stack.pop()
                if isinstance(node, dict):
                    stack.extend(node.values())
                elif isinstance(node, list):
                    stack.extend(node)
                elif node is not None:
                    texts.add(str(node))
            found.update(t for t in texts if len(t) >= 3)

    take(ev.EXECUTION_STARTED, {"flow": state.flow, "input": state.input})
    for entry in state.steps:
        if entry and entry[1] == COMPLETED:
            take(ev.STEP_COMPLETED, {"step": entry[0], "result": entry[2]})
    return sorted(found, key=len, reverse=True)
