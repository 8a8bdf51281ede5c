"""Flows the schedule, CLI and queue-admin tests start (imported by their worker processes too)."""

from __future__ import annotations

from journal.flows import flow


@flow("sched.echo")
def echo(ctx, value):
    """One step: what a scheduled tick's execution does."""
    return ctx.step("echo", lambda: value)


@flow("sched.fail")
def fail(ctx, value):
    """A flow that fails in its first step (the CLI's retry needs a failed execution)."""

    def boom():
        raise RuntimeError("boom")

    return ctx.step("boom", boom)
