"""What a run of a flow returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Outcome:
    """execution_id: None for a transient call. status: completed, failed or cancelled; or waiting /
    suspended when the run parked (journal/flows/waits.py); queued for start(..., queue=...) (a worker runs it).
    result: the flow's return value (completed only). error: why it failed or was cancelled."""

    execution_id: str | None
    status: str
    result: Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "completed"

    @property
    def parked(self) -> bool:
        """The run parked (waiting: a worker wakes it; suspended: resume() does): no result yet."""
        return self.status in ("waiting", "suspended")
