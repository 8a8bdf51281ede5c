"""What a run of a flow returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Outcome:
    """execution_id: None for a transient call. status: completed, failed or cancelled.
    result: the flow's return value (completed only). error: why it failed or was cancelled."""

    execution_id: str | None
    status: str
    result: Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "completed"
