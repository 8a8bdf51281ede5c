"""Flows of the admin tests, in a module of their own so that a `loom_worker` child can import them
(LOOM_FLOW_MODULES). Each misbehaves only where a test flips a flag: a fresh worker process runs
them cleanly, which is what a resume or a retry handed over to it should see."""

from __future__ import annotations

from journal.flows import NonRetryableError, flow
from journal.flows.context import Halt


class Crash(Halt):
    """Stops the run like a crash would: nothing settles, the log stays open.
    A Halt (the runtime's own unwinding, let through like a crash): any other BaseException raised by a flow
    or a step (SystemExit) is a failure of that attempt."""

    def __init__(self, message: str = "simulated crash") -> None:
        BaseException.__init__(self, message)
        self.error = self  # what the run stops with: raised to the caller, nothing settles


CRASH = False  # admin.crash_once dies in its second step while this is true
FAIL = False  # admin.fail_second fails its second step for good while this is true
CALLS: dict[str, int] = {}  # runs of the first step per execution (replayed steps do not run)


def first(execution_id: str) -> int:
    CALLS[execution_id] = CALLS.get(execution_id, 0) + 1
    return 1


def second() -> int:
    if CRASH:
        raise Crash("simulated crash mid-step")
    if FAIL:
        raise NonRetryableError("the second step fails until it is fixed")
    return 2


@flow("admin.crash_once")
def crash_once(ctx, value):
    one = ctx.step("first", first, ctx.execution_id)
    two = ctx.step("second", second)
    return {"first": one, "second": two}


@flow("admin.fail_second")
def fail_second(ctx, value):
    one = ctx.step("first", first, ctx.execution_id)
    two = ctx.step("second", second)
    return {"first": one, "second": two}
