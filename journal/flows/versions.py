"""Which flow versions still have executions in flight: what an operator checks before retiring one.

An execution resumes only on the version it started on (docs/flows.md "Versions"), so version N of a
flow may leave the code once no execution of it is live: none running, waiting, suspended or stuck
(`stuck` is not settled: an operator may still resume it). `live_versions()` counts them per flow and
version on each database (every shard by default), beside the versions this process registers; the
admin's flows page and `manage.py loom flows` show it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from journal import shards
from journal.flows import registry
from journal.flows.state import TERMINAL
from journal.models import Execution


@dataclass(frozen=True, slots=True)
class FlowVersion:
    """One version of one flow: its live executions by status, and whether this process has its code."""

    flow: str
    version: int
    registered: bool
    live: dict[str, int] = field(default_factory=dict)

    @property
    def live_total(self) -> int:
        return sum(self.live.values())

    @property
    def retirable(self) -> bool:
        """No execution of it is live: removing its code strands none."""
        return not self.live

    def as_json(self) -> dict:
        return {"flow": self.flow, "version": self.version, "registered": self.registered,
                "live": dict(self.live), "live_total": self.live_total, "retirable": self.retirable}


def live_counts(aliases: list[str]) -> dict[tuple[str, int], dict[str, int]]:
    """(flow, version) -> {status: executions} of the executions not settled, over `aliases`. One grouped
    read per database of the unsettled headers only (the status index)."""
    from django.db.models import Count

    counts: dict[tuple[str, int], dict[str, int]] = {}
    for alias in aliases:
        rows = (Execution.objects.using(alias).exclude(status__in=sorted(TERMINAL))
                .values_list("flow", "flow_version", "status").annotate(n=Count("id")).order_by())
        for flow, version, status, n in rows:
            per = counts.setdefault((flow, version), {})
            per[status] = per.get(status, 0) + n
    return counts


def live_versions(aliases: list[str] | None = None, flow: str | None = None) -> list[FlowVersion]:
    """Every (flow, version) that is registered here or has live executions, sorted; `flow`: that one only.
    `aliases`: the databases to count on (default: every shard)."""
    counts = live_counts(aliases if aliases is not None else shards.shards())
    keys = set(counts) | set(registry.runnable())
    here = set(registry.runnable())
    return [FlowVersion(name, version, (name, version) in here, dict(sorted(counts.get((name, version), {}).items())))
            for name, version in sorted(keys) if flow is None or name == flow]
