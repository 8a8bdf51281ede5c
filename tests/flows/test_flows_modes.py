"""The flows conformance suite, parametrised: every test runs a sync flow (`modes.sync.<x>`) and its `async def`
twin (`modes.async.<x>`, tests/fixtures/mode_flows.py) and checks the same log, the same effects, the same
outcome. SQLite and PostgreSQL. An async flow's journal is the sync runtime's (journal/flows/aio.py): these
tests are what says so."""

from __future__ import annotations

import time

import pytest

from journal.flows import (
    NeedsDurable,
    NonDeterminism,
    Outcome,
    cancel,
    get_event,
    get_flow,
    invoke_transient,
    resume,
    send,
    start,
    wake_due,
)
from journal.flows import events as ev
from journal.flows import ownership as own
from journal.flows.replay import replay
from journal.models import Event, Execution, Fence, Message, Wait
from tests.conftest import effect_rows
from tests.fixtures import flows_fixtures as fx
from tests.fixtures import mode_flows as mf

pytestmark = pytest.mark.django_db


@pytest.fixture(params=["sync", "async"])
def mode(request, settings, effects):
    settings.LOOM_FLOW_MODULES = ["tests.fixtures.mode_flows"]
    settings.LOOM_SNAPSHOT_EVERY = None
    settings.LOOM_WAIT_INLINE_MAX = 0.0
    settings.LOOM_WAIT_POLL = 0.05
    mf.CRASH_PASSES["value"] = False
    mf.FAIL_TIMES.clear()
    installed = own.get_ownership()
    own.set_ownership(None)
    yield request.param
    own.set_ownership(installed)


def name(mode: str, flow: str) -> str:
    return f"modes.{mode}.{flow}"


def types(execution_id: str) -> list[str]:
    return [e.type for e in Event.objects.read(execution_id)]


def status(execution_id: str) -> str:
    return Execution.objects.get(pk=execution_id).status


def ran(execution_id: str) -> list[str]:
    return [step for eid, step in effect_rows() if eid == execution_id]


def wake_until(execution_id: str, limit: float = 20.0) -> str:
    give_up = time.monotonic() + limit
    while time.monotonic() < give_up:
        wake_due()
        if status(execution_id) in ("completed", "failed", "cancelled"):
            return status(execution_id)
        time.sleep(0.02)
    raise AssertionError(f"{execution_id} still {status(execution_id)}")


@pytest.mark.parametrize("steps", [0, 3])
def test_n_steps_write_2n_plus_2_events(mode, steps):
    out = start(name(mode, "chain"), {"n": steps}, execution_id=f"c{steps}")
    assert out == Outcome(f"c{steps}", "completed", sum(range(steps)), None)
    assert types(f"c{steps}") == ([ev.EXECUTION_STARTED] + [ev.STEP_STARTED, ev.STEP_COMPLETED] * steps
                                  + [ev.EXECUTION_COMPLETED])
    assert [e.payload["result"] for e in Event.objects.read(f"c{steps}") if e.type == ev.STEP_COMPLETED] == list(
        range(steps))
    assert status(f"c{steps}") == "completed"


def test_a_crash_is_resumed_without_running_a_completed_step_again(mode):
    with pytest.raises(fx.Crash):
        start(name(mode, "effects"), {}, execution_id="e1")
    assert status("e1") == "running" and ran("e1") == ["one", "two"]
    mf.CRASH_PASSES["value"] = True
    assert resume("e1") == Outcome("e1", "completed", "four", None)
    assert ran("e1") == ["one", "two", "four"]  # each effect exactly once
    assert Fence.objects.current("e1") == 2
    assert resume("e1").status == "completed" and ran("e1") == ["one", "two", "four"]


def test_changed_code_is_non_deterministic_on_resume_and_writes_nothing(mode):
    with pytest.raises(fx.Crash):
        start(name(mode, "effects"), {}, execution_id="nd")
    definition = get_flow(name(mode, "effects"))
    original = definition.fn

    async def changed_async(ctx, value):
        await ctx.step("renamed", lambda: 1)

    def changed(ctx, value):
        ctx.step("renamed", lambda: 1)

    object.__setattr__(definition, "fn", changed_async if mode == "async" else changed)
    try:
        before = len(Event.objects.read("nd"))
        with pytest.raises(NonDeterminism, match="the log recorded step 'one'"):
            resume("nd")
        assert len(Event.objects.read("nd")) == before
        assert not replay(["nd"])[0].ok
    finally:
        object.__setattr__(definition, "fn", original)
    assert replay(["nd"])[0].ok


def test_retries_then_success_and_a_refusal_at_the_first_attempt(mode):
    mf.FAIL_TIMES["k"] = 2
    out = start(name(mode, "retrying"), {"key": "k"}, execution_id="r1")
    assert out.status == "completed" and out.result == "k"
    assert types("r1").count(ev.STEP_FAILED) == 2
    out = start(name(mode, "refusing"), {}, execution_id="r2")
    assert out.status == "failed" and "NonRetryableError" in out.error
    assert types("r2").count(ev.STEP_STARTED) == 1


def test_a_durable_sleep_parks_and_is_woken_once(mode):
    assert start(name(mode, "sleeper"), {"seconds": 0.2}, execution_id="s1").status == "waiting"
    assert Wait.objects.filter(execution_id="s1").count() == 1
    assert wake_until("s1") == "completed"
    assert ran("s1") == ["before", "after"]
    assert types("s1").count(ev.WAIT_STARTED) == 1
    assert Wait.objects.filter(execution_id="s1").count() == 0


def test_messages_are_consumed_exactly_once_and_events_published(mode):
    assert start(name(mode, "talker"), {"n": 2}, execution_id="t1").status == "waiting"
    send("t1", "in", 5, message_id="a")
    send("t1", "in", 5, message_id="a")  # the same send: idempotent
    wake_due()  # the send made its wait due: the run consumes it, publishes it, parks again
    assert get_event("t1", "got-0", timeout=5) == 5
    send("t1", "in", 7, message_id="b")
    assert wake_until("t1") == "completed"
    assert Execution.objects.get(pk="t1").result == 12
    assert get_event("t1", "sum") == 12
    assert Message.objects.filter(execution_id="t1", consumed_at__isnull=False).count() == 2


def test_a_child_result_wakes_its_parent(mode):
    assert start(name(mode, "parent"), {"n": 4}, execution_id="p1").status == "waiting"
    assert wake_until("p1") == "completed"
    assert Execution.objects.get(pk="p1").result == {"child": "p1.child-0", "result": 40}
    assert ran("p1.child-0") == ["child-work"]


def test_continue_as_new_links_fresh_logs(mode):
    out = start(name(mode, "counter"), {"i": 0, "upto": 3}, execution_id="k")
    assert out.result == {"continued_as": "k~1"}
    assert wake_until("k~2") == "completed"
    assert Execution.objects.get(pk="k~2").result == 3


def test_cancel_stops_a_running_flow_at_its_next_step_boundary(mode):
    out = start(name(mode, "self_cancel"), {}, execution_id="x1")
    assert out == Outcome("x1", "cancelled", None, "stop please")
    assert ran("x1") == []
    assert types("x1") == [ev.EXECUTION_STARTED, ev.STEP_STARTED, ev.STEP_COMPLETED, ev.STEP_STARTED,
                           ev.EXECUTION_CANCELLED]
    assert cancel("x1").status == "cancelled"


def test_a_waiting_execution_is_cancelled(mode):
    assert start(name(mode, "talker"), {"n": 1}, execution_id="x2").status == "waiting"
    assert cancel("x2", "operator").error == "operator"
    assert status("x2") == "cancelled" and Wait.objects.filter(execution_id="x2").count() == 0


def test_a_step_past_its_timeout_is_told_and_fails(mode):
    mf.TOLD.clear()
    out = start(name(mode, "told"), {}, execution_id="h1")
    assert out.status == "failed" and "deadline exceeded" in out.error
    assert mf.TOLD == ["h1"]  # ctx.cancelled() turned True inside the (coroutine) step


def test_a_patch_marker_is_recorded_and_replayed(mode):
    out = start(name(mode, "patched"), {}, execution_id="v1")
    assert out.result == "new"
    steps = [e.payload["step"] for e in Event.objects.read("v1") if e.type == ev.STEP_COMPLETED]
    assert steps == ["$patch:v2", "new"]
    assert replay(["v1"])[0].ok


def test_an_async_flow_is_not_run_transiently(mode):
    if mode == "sync":
        assert invoke_transient(name(mode, "chain"), {"n": 2}).result == 1
    else:
        with pytest.raises(NeedsDurable, match="async flow"):
            invoke_transient(name(mode, "chain"), {"n": 2})
