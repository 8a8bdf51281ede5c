"""Async flows that sleep in-process (tests/flows/test_flows_async_sleep.py and the worker processes of
tests/flows/test_flows_async_processes.py and test_flows_async_worker_loop.py: no marked field here, so a worker
needs no LOOM_KEYS)."""

from __future__ import annotations

from datetime import datetime

from journal.flows import flow
from tests.fixtures.edge_waits_flows import record


@flow("asleep.edge")
async def edge(ctx, value):
    """An effect (an atomic step: one row), a short in-process sleep, an effect: each row exactly once."""
    await ctx.step("before", record, ctx.execution_id, "before", atomic=True)
    await ctx.sleep(value["seconds"])
    return await ctx.step("after", record, ctx.execution_id, "after", atomic=True)


@flow("asleep.until")
async def until(ctx, value):
    """An effect, an in-process sleep until value["until"] (an ISO time: every run of a batch wakes at the same
    moment, so they are all asleep together however long their dispatch took), an effect."""
    await ctx.step("before", record, ctx.execution_id, "before", atomic=True)
    await ctx.sleep_until(datetime.fromisoformat(value["until"]))
    return await ctx.step("after", record, ctx.execution_id, "after", atomic=True)
