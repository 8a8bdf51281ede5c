"""Reading an execution for people: its events, the timeline of its steps, its fence and snapshot."""

from __future__ import annotations

from typing import Any

from journal.flows import events as ev
from journal.flows.errors import UnknownExecution
from journal.flows.state import ExecutionState


def timeline(events) -> list[dict[str, Any]]:
    """One row per step attempt: step, position, attempt, status, duration (ms), result or error."""
    rows: list[dict[str, Any]] = []
    open_rows: dict[int, dict[str, Any]] = {}
    for event in events:
        p = event.payload if isinstance(event.payload, dict) else {}
        if event.type == ev.STEP_STARTED:
            row = {"pos": p.get("pos"), "step": p.get("step"), "attempt": p.get("attempt", 1), "status": "started",
                   "started_at": event.recorded_at, "started_seq": event.seq, "ms": None, "result": None,
                   "error": ""}
            rows.append(row)
            open_rows[p.get("pos")] = row
        elif event.type in (ev.STEP_COMPLETED, ev.STEP_FAILED):
            row = open_rows.pop(p.get("pos"), None)
            if row is None:
                continue
            row["ms"] = p.get("ms")
            row["finished_at"] = event.recorded_at
            if event.type == ev.STEP_COMPLETED:
                row["status"], row["result"] = "completed", p.get("result")
            else:
                row["status"] = "retrying" if p.get("retry") else "failed"
                row["error"] = p.get("error", "")
    return rows


def describe(execution_id: str) -> dict[str, Any]:
    """Everything known about an execution (reads the whole log: for people, not for the hot path)."""
    from journal.models import Event, Execution, Fence, Snapshot

    events = Event.objects.read(execution_id)
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
        "status": state.status,
        "input": state.input,
        "result": state.result,
        "error": state.error or None,
        "header_status": header.get("status"),
        "created_at": header.get("created_at"),
        "finished_at": header.get("finished_at"),
        "fence": Fence.objects.current(execution_id),
        "snapshot_seq": None if snapshot is None else snapshot.seq,
        "steps": timeline(events),
        "events": [{"seq": e.seq, "type": e.type, "payload": e.payload, "recorded_at": e.recorded_at}
                   for e in events],
    }
