"""The flows of the sync/async conformance suite (tests/flows/test_flows_modes.py): each flow twice, as `modes.sync.<x>`
(a plain function) and `modes.async.<x>` (an `async def` flow whose steps are coroutine functions where a step may
be one), the same steps in the same order, so that one parametrised test checks both against the same log.
A module, so that worker processes can import it (LOOM_FLOW_MODULES)."""

from __future__ import annotations

import asyncio

from journal.flows import NonRetryableError, RetryPolicy, flow
from tests.flows_fixtures import Crash, record_effect

CRASH_PASSES = {"value": False}
FAIL_TIMES: dict[str, int] = {}
TOLD: list[str] = []  # executions whose step saw ctx.cancelled() turn True


def _flaky(key: str) -> str:
    left = FAIL_TIMES.get(key, 0)
    if left:
        FAIL_TIMES[key] = left - 1
        raise ConnectionError(f"flaky {key}")
    return key


async def _aflaky(key: str) -> str:
    await asyncio.sleep(0)
    return _flaky(key)


def _crash_unless_passes() -> int:
    if not CRASH_PASSES["value"]:
        raise Crash()
    return 2


async def _aecho(value):
    await asyncio.sleep(0)
    return value


# -- n steps --------------------------------------------------------------------------------------------
@flow("modes.sync.chain")
def chain(ctx, value):
    return sum(ctx.step(f"s{i}", lambda i=i: i) for i in range(value["n"]))


@flow("modes.async.chain")
async def achain(ctx, value):
    total = 0
    for i in range(value["n"]):
        total += await ctx.step(f"s{i}", _aecho, i)
    return total


# -- effects, an atomic step, a crash and a resume ---------------------------------------------------------
@flow("modes.sync.effects")
def effects(ctx, value):
    eid = ctx.execution_id
    ctx.step("one", record_effect, eid, "one")
    ctx.step("two", record_effect, eid, "two", atomic=True)
    ctx.step("three", _crash_unless_passes)
    return ctx.step("four", record_effect, eid, "four")


@flow("modes.async.effects")
async def aeffects(ctx, value):
    eid = ctx.execution_id
    await ctx.step("one", record_effect, eid, "one")  # a sync function in an async flow: the drive thread runs it
    await ctx.step("two", record_effect, eid, "two", atomic=True)
    await ctx.step("three", _crash_unless_passes)
    return await ctx.step("four", record_effect, eid, "four")


# -- retries ------------------------------------------------------------------------------------------------
@flow("modes.sync.retrying", retry=RetryPolicy(attempts=3))
def retrying(ctx, value):
    return ctx.step("flaky", _flaky, value["key"])


@flow("modes.async.retrying", retry=RetryPolicy(attempts=3))
async def aretrying(ctx, value):
    return await ctx.step("flaky", _aflaky, value["key"])


@flow("modes.sync.refusing")
def refusing(ctx, value):
    def no():
        raise NonRetryableError("no")

    return ctx.step("no", no)


@flow("modes.async.refusing")
async def arefusing(ctx, value):
    async def no():
        raise NonRetryableError("no")

    return await ctx.step("no", no)


# -- waits: sleep, messages, events, children, continue-as-new ----------------------------------------------
@flow("modes.sync.sleeper")
def sleeper(ctx, value):
    ctx.step("before", record_effect, ctx.execution_id, "before")
    ctx.sleep(value["seconds"])
    return ctx.step("after", record_effect, ctx.execution_id, "after")


@flow("modes.async.sleeper")
async def asleeper(ctx, value):
    await ctx.step("before", record_effect, ctx.execution_id, "before")
    await ctx.sleep(value["seconds"])
    return await ctx.step("after", record_effect, ctx.execution_id, "after")


@flow("modes.sync.talker")
def talker(ctx, value):
    """Receives `n` messages, publishes each, and their sum."""
    got = []
    for i in range(value["n"]):
        got.append(ctx.recv("in"))
        ctx.set_event(f"got-{i}", got[-1])
    ctx.set_event("sum", sum(got))
    return sum(got)


@flow("modes.async.talker")
async def atalker(ctx, value):
    got = []
    for i in range(value["n"]):
        got.append(await ctx.recv("in"))
        await ctx.set_event(f"got-{i}", got[-1])
    await ctx.set_event("sum", sum(got))
    return sum(got)


@flow("modes.sync.child")
def child(ctx, value):
    return ctx.step("child-work", record_effect, ctx.execution_id, "child-work") and value["n"] * 10


@flow("modes.async.child")
async def achild(ctx, value):
    await ctx.step("child-work", record_effect, ctx.execution_id, "child-work")
    return value["n"] * 10


@flow("modes.sync.parent")
def parent(ctx, value):
    handle = ctx.start_child("modes.sync.child", {"n": value["n"]})
    return {"child": handle.execution_id, "result": handle.result()}


@flow("modes.async.parent")
async def aparent(ctx, value):
    handle = await ctx.start_child("modes.async.child", {"n": value["n"]})
    return {"child": handle.execution_id, "result": await handle.result()}


@flow("modes.sync.counter")
def counter(ctx, value):
    done = ctx.step("count", lambda: value["i"] + 1)
    if done < value["upto"]:
        ctx.continue_as_new({"i": done, "upto": value["upto"]})
    return done


@flow("modes.async.counter")
async def acounter(ctx, value):
    done = await ctx.step("count", _aecho, value["i"] + 1)
    if done < value["upto"]:
        await ctx.continue_as_new({"i": done, "upto": value["upto"]})
    return done


# -- cancel, heartbeats, patches ----------------------------------------------------------------------------
@flow("modes.sync.self_cancel")
def self_cancel(ctx, value):
    from journal.flows import cancel

    ctx.step("one", lambda: 1)
    ctx.step("cancel", lambda: cancel(ctx.execution_id, "stop please").status)
    ctx.step("never", record_effect, ctx.execution_id, "never")


@flow("modes.async.self_cancel")
async def aself_cancel(ctx, value):
    from journal.flows import cancel

    await ctx.step("one", _aecho, 1)
    await ctx.step("cancel", lambda: cancel(ctx.execution_id, "stop please").status)
    await ctx.step("never", record_effect, ctx.execution_id, "never")


@flow("modes.sync.told")
def told(ctx, value):
    """A step that runs past its timeout, checking ctx.cancelled(), then says whether it was told."""
    import time

    def work():
        for _ in range(200):
            if ctx.cancelled():
                TOLD.append(ctx.execution_id)
                return "told"
            time.sleep(0.01)
        return "never told"

    return ctx.step("work", work, timeout=0.05, retry=RetryPolicy(attempts=1))


@flow("modes.async.told")
async def atold(ctx, value):
    async def work():
        for _ in range(200):
            if ctx.cancelled():
                TOLD.append(ctx.execution_id)
                return "told"
            await asyncio.sleep(0.01)
        return "never told"

    return await ctx.step("work", work, timeout=0.05, retry=RetryPolicy(attempts=1))


@flow("modes.sync.patched")
def patched(ctx, value):
    if ctx.patched("v2"):
        return ctx.step("new", lambda: "new")
    return ctx.step("old", lambda: "old")


@flow("modes.async.patched")
async def apatched(ctx, value):
    if await ctx.patched("v2"):
        return await ctx.step("new", _aecho, "new")
    return await ctx.step("old", _aecho, "old")


# -- versions (docs/flows.md "Versions"): an async flow's executions resume on the version they started on ------
@flow("modes.async.versioned", version=1)
async def aversioned_v1(ctx, value):
    await ctx.step("v1-only", _aecho, "v1")
    return {"version": 1, "got": await ctx.recv("go")}


@flow("modes.async.versioned", version=2)
async def aversioned_v2(ctx, value):
    return {"version": 2, "got": await ctx.recv("go")}
