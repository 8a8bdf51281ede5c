"""Flows used by tests/flows/test_flows*.py, in a module so that child processes can import them
(the tests list this module in LOOM_FLOW_MODULES)."""

from __future__ import annotations

import os
import time

from django.db import connection
from pydantic import BaseModel

from journal.flows import NonRetryableError, RetryPolicy, flow
from journal.flows.context import Halt

EFFECTS_TABLE = "test_flow_effects"


def record_effect(execution_id: str, step: str) -> str:
    """A side effect: one row in a table the test created with raw SQL."""
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {EFFECTS_TABLE} (execution_id, step) VALUES (%s, %s)", [execution_id, step])
    return step


class AddInput(BaseModel):
    a: int
    b: int


@flow("test.add")
def add(ctx, value):
    return ctx.step("add", lambda: value["a"] + value["b"])


@flow("test.add_model", input_model=AddInput)
def add_model(ctx, value: AddInput):
    return ctx.step("add", lambda: value.a + value.b)


@flow("test.chain")
def chain(ctx, value):
    total = 0
    for i in range(value["n"]):
        total += ctx.step(f"s{i}", lambda i=i: i)
    return total


@flow("test.nosteps")
def nosteps(ctx, value):
    return {"echo": value}


@flow("test.effects")
def effects(ctx, value):
    """Three steps with effects; the middle one (atomic) hangs mid-step on its first run only."""
    eid = ctx.execution_id
    ctx.step("one", record_effect, eid, "one")

    def two() -> str:
        record_effect(eid, "two")
        marker = value["marker"]
        if not os.path.exists(marker):
            with open(marker, "w") as fh:
                fh.write(str(os.getpid()))
            time.sleep(120)  # killed here by the test
        return "two"

    ctx.step("two", two, atomic=True)
    ctx.step("three", record_effect, eid, "three")
    return "done"


@flow("test.blocking")
def blocking(ctx, value):
    """First run waits mid-step until `release` exists; a later run (resume) goes straight through."""

    def wait() -> str:
        marker, release = value["marker"], value["release"]
        if not os.path.exists(marker):
            with open(marker, "w") as fh:
                fh.write(str(os.getpid()))
            deadline = time.monotonic() + 60
            while not os.path.exists(release) and time.monotonic() < deadline:
                time.sleep(0.02)
        return "waited"

    ctx.step("wait", wait)
    ctx.step("after", lambda: "after")
    return "finished"


_calls: dict[str, int] = {}


def flaky(key: str, fail_times: int, error: type[Exception] = RuntimeError) -> int:
    _calls[key] = _calls.get(key, 0) + 1
    if _calls[key] <= fail_times:
        raise error(f"attempt {_calls[key]} of {key} fails")
    return _calls[key]


@flow("test.retry")
def retry(ctx, value):
    return ctx.step("flaky", flaky, value["key"], value["fail"], retry=RetryPolicy(attempts=value["attempts"]))


@flow("test.nonretryable")
def nonretryable(ctx, value):
    return ctx.step("flaky", flaky, value["key"], 5, NonRetryableError, retry=RetryPolicy(attempts=5))


@flow("test.versioned")
def versioned(ctx, value):
    """Asks for the step named by the module-level VERSIONED_STEP (a test changes it under a log)."""
    first = ctx.step(VERSIONED_STEP, lambda: 1)
    if value.get("block"):
        ctx.step("block", lambda: (_ for _ in ()).throw(RuntimeError("crash")))
    return first


VERSIONED_STEP = "alpha"


class Crash(Halt):
    """Raised by a step to stop the run like a crash would: nothing settles, the log stays open.
    A Halt (the runtime's own unwinding, let through like a crash): any other BaseException raised by a flow
    or a step (SystemExit) is a failure of that attempt."""

    def __init__(self, message: str = "simulated crash") -> None:
        BaseException.__init__(self, message)
        self.error = self  # what the run stops with: raised to the caller, nothing settles


def crash() -> None:
    raise Crash("simulated crash mid-step")


@flow("test.crashing")
def crashing(ctx, value):
    """Step one completes; step two dies mid-step unless the input says it may pass."""
    ctx.step("one", lambda: 1)
    ctx.step("two", (lambda: 2) if CRASH_PASSES else crash)
    return "ok"


CRASH_PASSES = False


@flow("test.once")
def once(ctx, value):
    return ctx.step("effect", record_effect, ctx.execution_id, "effect")


@flow("test.self_cancel")
def self_cancel(ctx, value):
    from journal.flows import cancel

    ctx.step("one", lambda: 1)
    ctx.step("cancel", lambda: cancel(ctx.execution_id, "stop please").status)
    ctx.step("never", record_effect, ctx.execution_id, "never")
    return "not reached"
