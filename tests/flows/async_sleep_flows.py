"""Async flows that sleep in-process (tests/flows/test_flows_async_sleep.py; importable by a child process)."""

from __future__ import annotations

from journal.flows import flow
from tests import privacy_fixtures as pf
from tests.edge_waits_flows import record


@flow("asleep.marked", input_model=pf.Signup)
async def marked(ctx, value: pf.Signup):
    """A marked input and a marked step result on both sides of a short sleep."""

    async def greet() -> dict:
        return {"customer_id": value.customer_id, "text": f"hi {value.email}"}

    await ctx.step("privacy.greet", greet)
    await ctx.sleep(5)
    again = await ctx.step("privacy.greet", greet)
    return {"greeted": bool(again["text"])}


@flow("asleep.edge")
async def edge(ctx, value):
    """An effect (an atomic step: one row), a short in-process sleep, an effect: each row exactly once."""
    await ctx.step("before", record, ctx.execution_id, "before", atomic=True)
    await ctx.sleep(value["seconds"])
    return await ctx.step("after", record, ctx.execution_id, "after", atomic=True)
