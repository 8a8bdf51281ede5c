"""The one timestamp format of the admin pages (executions, events, aggregates): UTC, to the millisecond."""

from __future__ import annotations

from datetime import UTC, datetime


def stamp(when: datetime | None) -> str:
    """`2026-11-30 21:24:30.123 UTC`; "" for None."""
    if when is None:
        return ""
    return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.") + f"{when.microsecond // 1000:03d} UTC"
