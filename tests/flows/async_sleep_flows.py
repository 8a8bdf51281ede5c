"""Async flows that sleep in-process (tests/flows/test_flows_async_sleep.py and a worker process of
tests/flows/test_flows_async_processes.py: no marked field here, so a worker needs no LOOM_KEYS)."""

from __future__ import annotations

from journal.flows import flow
from tests.fixtures.edge_waits_flows import record


@flow("asleep.edge")
async def edge(ctx, value):
    """An effect (an atomic step: one row), a short in-process sleep, an effect: each row exactly once."""
    await ctx.step("before", record, ctx.execution_id, "before", atomic=True)
    await ctx.sleep(value["seconds"])
    return await ctx.step("after", record, ctx.execution_id, "after", atomic=True)
