"""Flows that wait, used by tests/flows/test_waits_engine*.py (and importable by worker processes through
LOOM_FLOW_MODULES). Each step's effect is a row in the effects table, so a test counts runs."""

from __future__ import annotations

from journal.flows import RetryPolicy, flow
from tests.flows_fixtures import record_effect

FAIL_TIMES: dict[str, int] = {}


@flow("waits.sleeper")
def sleeper(ctx, value):
    ctx.step("before", record_effect, ctx.execution_id, "before")
    ctx.sleep(value.get("seconds", 60))
    return ctx.step("after", record_effect, ctx.execution_id, "after")


@flow("waits.until")
def until(ctx, value):
    from datetime import datetime

    ctx.sleep_until(datetime.fromisoformat(value["when"]))
    return ctx.step("after", record_effect, ctx.execution_id, "after")


@flow("waits.receiver")
def receiver(ctx, value):
    got = ctx.recv(value.get("topic", "go"), timeout=value.get("timeout"))
    ctx.step("after", record_effect, ctx.execution_id, "after")
    return got


@flow("waits.two_messages")
def two_messages(ctx, value):
    first = ctx.recv("t")
    second = ctx.recv("t")
    return [first, second]


@flow("waits.publisher")
def publisher(ctx, value):
    ctx.set_event("stage", "one")
    got = ctx.recv("next")
    ctx.set_event("stage", {"got": got})
    return got


@flow("waits.child")
def child(ctx, value):
    ctx.step("child-work", record_effect, ctx.execution_id, "child-work")
    if value.get("fail"):
        raise RuntimeError("child failed on purpose")
    if value.get("wait"):
        ctx.recv("release")
    return value["n"] * 10


@flow("waits.parent")
def parent(ctx, value):
    handle = ctx.start_child("waits.child", {"n": value["n"], "fail": value.get("fail", False),
                                             "wait": value.get("wait", False)})
    return {"child": handle.execution_id, "result": handle.result()}


@flow("waits.counter")
def counter(ctx, value):
    n = ctx.step("count", lambda: value["n"] + 1)
    if n < value["until"]:
        ctx.continue_as_new({"n": n, "until": value["until"]})
    return n


@flow("waits.flaky", retry=RetryPolicy(attempts=3, backoff=30.0))
def flaky(ctx, value):
    def attempt():
        record_effect(ctx.execution_id, "attempt")
        left = FAIL_TIMES.get(ctx.execution_id, 0)
        if left > 0:
            FAIL_TIMES[ctx.execution_id] = left - 1
            raise RuntimeError("flaky")
        return "ok"

    return ctx.step("flaky", attempt)


@flow("waits.steps")
def steps(ctx, value):
    out = []
    for i in range(value.get("n", 3)):
        out.append(ctx.step(f"s{i}", record_effect, ctx.execution_id, f"s{i}-{value.get('tag', '')}"))
    return out


@flow("waits.slow_step")
def slow_step(ctx, value):
    import time

    return ctx.step("slow", lambda: time.sleep(value["seconds"]) or "done", timeout=value["timeout"])


@flow("waits.deadline")
def deadline(ctx, value):
    ctx.step("first", record_effect, ctx.execution_id, "first")
    ctx.recv("never")
    return "unreachable"


@flow("waits.reply")
def reply(ctx, value):
    got = ctx.recv("next")
    ctx.set_event("reply", {"got": got})
    return got


@flow("waits.deadline_handler")
def deadline_handler(ctx, value):
    from journal.flows import DeadlineExceeded

    try:
        ctx.recv("never")
    except DeadlineExceeded:
        ctx.step("compensate", record_effect, ctx.execution_id, "compensate")
        return "handled"
    return "unreachable"


CRASH_IN_STEP = True


@flow("waits.timed_crash")
def timed_crash(ctx, value):
    """A step with a timeout whose first run dies in it (a BaseException: no record of the end)."""
    from tests.flows_fixtures import crash

    def body():
        if CRASH_IN_STEP:
            crash()
        return "ran"

    return ctx.step("timed", body, timeout=value["timeout"])


@flow("waits.self_suspend")
def self_suspend(ctx, value):
    """Tries to suspend (and resume) itself from inside a step: a live run must not be taken over."""
    from journal.flows import ExecutionBusy, resume, suspend

    def attempt():
        refused = []
        for call in (lambda: suspend(ctx.execution_id), lambda: resume(ctx.execution_id)):
            try:
                call()
                refused.append("taken")
            except ExecutionBusy:
                refused.append("busy")
        return refused

    return ctx.step("try", attempt)


@flow("waits.receiver_once")
def receiver_once(ctx, value):
    """recv, then an atomic step: its effect commits with its record, so even a run fenced off in it
    leaves no second effect."""
    got = ctx.recv("go")
    ctx.step("after", record_effect, ctx.execution_id, "after", atomic=True)
    return got


@flow("waits.chain")
def chain(ctx, value):
    """Continues as new until n reaches `until`; the last run may wait for a message first."""
    n = value["n"]
    if n < value["until"]:
        ctx.continue_as_new({**value, "n": n + 1})
    if value.get("wait"):
        ctx.recv("release")
    return f"final after {n}"


@flow("waits.chain_parent")
def chain_parent(ctx, value):
    handle = ctx.start_child("waits.chain", value)
    return handle.result()


@flow("waits.accumulator")
def accumulator(ctx, total):
    """The endless entity loop fed by messages: one message per run, then continue as new."""
    got = ctx.recv("add")
    if got == "stop":
        return total
    ctx.continue_as_new(total + got)


@flow("waits.spawner")
def spawner(ctx, value):
    ctx.step("before", record_effect, ctx.execution_id, "before")
    handle = ctx.start_child("waits.child", {"n": 1, "wait": True})
    return handle.result()


@flow("waits.progress")
def progress(ctx, value):
    """Publishes its count and continues; the last run waits for a message."""
    if value["n"] == 0:
        ctx.set_event("first", "set by the first run")
    ctx.set_event("count", value["n"])
    if value["n"] < value["until"]:
        ctx.continue_as_new({**value, "n": value["n"] + 1})
    ctx.recv("release")
    return value["n"]
