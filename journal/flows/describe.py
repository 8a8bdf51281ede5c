"""Reading an execution for people: its events, the timeline of its steps, its fence and snapshot."""

from __future__ import annotations

from typing import Any

from journal import shards
from journal.flows import events as ev
from journal.flows.errors import UnknownExecution
from journal.flows.state import ExecutionState
from journal.timestamps import stamp

PARKED = frozenset({"waiting", "suspended"})
# Statuses the header knows and the log does not (it says "not settled"): parked, or queued (accepted, not
# begun: journal/flows/queued.py).
FROM_HEADER = PARKED | {"queued"}


def timeline(events) -> list[dict[str, Any]]:
    """One row per step attempt: step, position, attempt, status, duration (ms), result or error, and a
    note. An attempt whose run died mid-step (the same position started again by a resume) is marked
    "interrupted; recovered by <worker> at <time>"; a retry of a failed execution is a row of its own."""
    rows: list[dict[str, Any]] = []
    open_rows: dict[int, dict[str, Any]] = {}
    pending_note = ""
    # Why the run before a resume stopped: it parked (a wait, a parked backoff, a retry of the execution, a
    # suspension) and was resumed as planned, or it died (a recovery). Only the second is "a recovery".
    parked, wait_pos = "", None
    for event in events:
        p = event.payload if isinstance(event.payload, dict) else {}
        if event.type in (ev.EXECUTION_RETRIED, ev.EXECUTION_RESUMED):
            parked = "a new attempt of the execution" if event.type == ev.EXECUTION_RETRIED else "after a suspension"
        if event.type == ev.STEP_STARTED:
            recovered = p.get("recovered_by")
            interrupted = open_rows.pop(p.get("pos"), None)
            by_whom = recovered.get("by") if isinstance(recovered, dict) else None
            if interrupted is not None:
                by = f" by {by_whom}" if by_whom else ""
                interrupted["status"] = "interrupted"
                interrupted["note"] = f"interrupted; recovered{by} at {stamp(event.recorded_at)}"
            elif isinstance(recovered, dict) and parked:
                pending_note = f"resumed by {by_whom or 'a worker'} ({parked})"
            elif isinstance(recovered, dict):
                pending_note = f"after a recovery by {by_whom or 'another process'}"
            parked = ""
            row = {"pos": p.get("pos"), "step": p.get("step"), "attempt": p.get("attempt", 1), "status": "started",
                   "started_at": event.recorded_at, "started_seq": event.seq, "ms": None, "result": None,
                   "error": "", "note": pending_note}
            pending_note = ""
            rows.append(row)
            open_rows[p.get("pos")] = row
        elif event.type == ev.WAIT_STARTED:
            wait_pos = p.get("pos")
            # A wait of flows that wait: a row of its own, open until its STEP_COMPLETED.
            row = {"pos": p.get("pos"), "step": p.get("step"), "attempt": 1, "status": "waiting",
                   "started_at": event.recorded_at, "started_seq": event.seq, "ms": None, "result": None,
                   "error": "", "note": _wait_note(p)}
            rows.append(row)
            open_rows[p.get("pos")] = row
        elif event.type == ev.WAIT_WOKEN:
            row = open_rows.get(p.get("pos"))
            if row is not None:
                row["note"] = f"{row['note']}; woken early by {p.get('by') or 'an operator'}"
        elif event.type in (ev.STEP_COMPLETED, ev.STEP_FAILED):
            row = open_rows.pop(p.get("pos"), None)
            if row is None:
                continue
            row["ms"] = p.get("ms")
            row["finished_at"] = event.recorded_at
            if event.type == ev.STEP_COMPLETED and p.get("pos") == wait_pos:
                parked, wait_pos = "after its wait", None
            elif event.type == ev.STEP_FAILED and p.get("retry"):
                parked = "the next attempt of its step"
            if event.type == ev.STEP_COMPLETED:
                row["status"], row["result"] = "completed", p.get("result")
            else:
                row["status"] = "retrying" if p.get("retry") else "failed"
                row["error"] = p.get("error", "")
                if isinstance(p.get("traceback"), str):  # any failed attempt (a task's: journal/tasks.py)
                    row["traceback"] = p["traceback"]
        elif event.type in ev.SETTLING:
            for row in open_rows.values():  # a step still going when the execution settled (a cancel)
                row["status"], row["note"] = "interrupted", f"interrupted by {event.type} at {stamp(event.recorded_at)}"
            open_rows.clear()
        elif event.type == ev.EXECUTION_RETRIED:
            actor = p.get("actor")
            rows.append({"pos": p.get("from_pos"), "step": "", "attempt": p.get("attempt"), "status": "retried",
                         "started_at": event.recorded_at, "started_seq": event.seq, "ms": None, "result": None,
                         "error": "", "note": f"execution attempt {p.get('attempt')} from step position "
                                              f"{p.get('from_pos')}" + (f", asked by {actor}" if actor else "")})
    return rows


def _wait_note(p: dict) -> str:
    """What a wait waits for, for people."""
    kind = p.get("kind")
    due = f" until {p['due_at']}" if p.get("due_at") else ""
    if kind == "recv":
        return f"waits for a message on {p.get('topic')!r}" + (f" (timeout{due})" if due else "")
    if kind == "child":
        return f"waits for child {p.get('child')}"
    return f"sleeps{due}"


@shards.by_stream
def describe(execution_id: str, reader=None) -> dict[str, Any]:
    """Everything known about an execution (reads the whole log: for people, not for the hot path).
    `reader` (journal.privacy.Reader): sensitive fields as that reader may see them; None: the system."""
    from journal.models import (  # app registry: journal.flows' lazy name, importable before it
        Event,
        Execution,
        Fence,
        Snapshot,
    )

    events = Event.objects.read(execution_id, reader=reader)
    if not events:
        raise UnknownExecution(execution_id)
    state = ExecutionState(execution_id)
    for event in events:
        state.apply(event.seq, event.type, event.payload)
    header = Execution.objects.filter(pk=execution_id).values("created_at", "finished_at", "status").first() or {}
    snapshot = Snapshot.objects.latest(execution_id)
    return {
        "execution_id": execution_id,
        "flow": state.flow,
        # A parked or queued execution's log says it is not settled; its header says how it waits.
        "status": header.get("status") if not state.settled and header.get("status") in FROM_HEADER
        else state.status,
        "input": state.input,
        "result": state.result,
        "error": state.error or None,
        "header_status": header.get("status"),
        "created_at": header.get("created_at"),
        "finished_at": header.get("finished_at"),
        "fence": Fence.objects.current(execution_id),
        "snapshot_seq": None if snapshot is None else snapshot.seq,
        "steps": (steps := timeline(events)),
        "traceback": failure_traceback(events, steps) if state.status == "failed" else None,
        # The tree (issue #28): the parent that started this one as its child, and the children it started.
        "parent": _parent(events),
        "children": [record[2] for record in state.steps
                     if record[0] == "$start_child" and record[1] == "completed" and isinstance(record[2], str)],
        "events": [{"seq": e.seq, "type": e.type, "payload": e.payload, "recorded_at": e.recorded_at}
                   for e in events],
    }


def _parent(events) -> str | None:
    """The parent execution named in the first EXECUTION_STARTED (`$parent`, journal/flows/waits.py)."""
    first = events[0].payload if events and events[0].seq == 0 else None
    parent = first.get("$parent") if isinstance(first, dict) else None
    return parent if isinstance(parent, str) else None


def failure_traceback(events, steps: list[dict]) -> str | None:
    """The traceback of a failed execution: its EXECUTION_FAILED's (the flow's own exception), else that of
    the step whose failure ended it (the last failed step row: a flow that let a StepFailed through)."""
    for event in reversed(events):
        if event.type == ev.EXECUTION_FAILED:
            text = event.payload.get("traceback") if isinstance(event.payload, dict) else None
            if isinstance(text, str):
                return text
            break
    for row in reversed(steps):
        if row.get("status") == "failed" and isinstance(row.get("traceback"), str):
            return row["traceback"]
    return None
