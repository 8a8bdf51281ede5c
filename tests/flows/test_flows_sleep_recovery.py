"""A run that died during a short in-process sleep (under LOOM_WAIT_INLINE_MAX) is resumed while the sleep is
still not due: the replay finds the sleep's WAIT_STARTED already durable, has nothing new to write, sleeps the
rest in-process and goes on. It used to flush an empty batch there, which the writer refuses, so the resume
halted — and every recovery of that execution halted the same way until the sleep was due. Sync and async
flows, resumed directly and by the recovery sweep; both backends (transactional: the async pool's threads
have sessions of their own)."""

from __future__ import annotations

import collections
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
from asgiref.sync import async_to_sync
from django.utils import timezone

from journal.flows import aio, context, flow, resume, start
from journal.flows.aio import aresume, astart
from journal.models import Event, Execution
from leases.keeper import LeaseKeeper, reset_keeper
from tests.fixtures.flows_fixtures import Crash

pytestmark = pytest.mark.django_db(transaction=True)

EFFECTS: collections.Counter = collections.Counter()


def _effect(name: str, eid: str) -> str:
    EFFECTS[(eid, name)] += 1
    return name


@flow("sleeprec.sync")
def sync_sleeper(ctx, value):
    ctx.step("before", _effect, "before", ctx.execution_id)
    ctx.sleep(value["seconds"])
    ctx.step("after", _effect, "after", ctx.execution_id)
    return "ok"


@flow("sleeprec.async")
async def async_sleeper(ctx, value):
    async def before() -> str:
        return _effect("before", ctx.execution_id)

    await ctx.step("before", before)
    await ctx.sleep(value["seconds"])
    await ctx.step("after", _effect, "after", ctx.execution_id)  # a sync step in an async flow
    return "ok"


@pytest.fixture(autouse=True)
def short_sleeps_are_in_process(settings):
    """Sleeps up to 30 s are slept in-process; this test's own lease keeper, stopped with the test."""
    settings.LOOM_WAIT_INLINE_MAX = 30.0
    EFFECTS.clear()
    keeper = LeaseKeeper()
    reset_keeper(keeper)
    yield
    keeper.shutdown()
    reset_keeper(None)


def _dies_in_its_sleep(monkeypatch) -> None:
    """The next in-process sleep of a sync-driven run raises Crash (the process "dies" in it: nothing settles)."""

    def crash(_seconds: float) -> None:
        raise Crash("died during the sleep")

    proxy = SimpleNamespace(**{name: getattr(time, name) for name in dir(time) if not name.startswith("_")})
    proxy.sleep = crash
    monkeypatch.setattr(context, "time", proxy)


def _types(eid: str) -> list[str]:
    return [e.type for e in Event.objects.read(eid)]


def _assert_once_and_done(eid: str) -> None:
    assert Execution.objects.get(pk=eid).status == "completed"
    assert EFFECTS[(eid, "before")] == 1 and EFFECTS[(eid, "after")] == 1
    flow_name = Execution.objects.get(pk=eid).flow
    if flow_name == "sleeprec.sync":
        start(flow_name, {"seconds": 0.01}, execution_id=f"{eid}-clean")
    else:
        async_to_sync(astart)(flow_name, {"seconds": 0.01}, execution_id=f"{eid}-clean")
    # The same events as a run that never died (its one WAIT_STARTED kept, not written twice).
    assert _types(eid) == _types(f"{eid}-clean")


def test_a_sync_run_resumed_during_its_short_sleep_sleeps_the_rest_and_completes(monkeypatch):
    with monkeypatch.context() as patch:
        _dies_in_its_sleep(patch)
        with pytest.raises(Crash):
            start("sleeprec.sync", {"seconds": 1.0}, execution_id="sleeprec-1")
    assert Execution.objects.get(pk="sleeprec-1").status == "running"
    assert _types("sleeprec-1")[-1] == "WAIT_STARTED"  # durable before the sleep; the sleep not due yet
    outcome = resume("sleeprec-1", force=True)  # well within the 1 s: the replay has nothing new to write
    assert outcome.result == "ok"
    _assert_once_and_done("sleeprec-1")


def test_the_recovery_sweep_resumes_a_run_that_died_in_its_short_sleep(monkeypatch):
    """The path the defect stopped: the sweep takes the orphan over and its resume must not halt."""
    from leases import tasks
    from leases.recovery import OrphanReach

    with monkeypatch.context() as patch:
        _dies_in_its_sleep(patch)
        with pytest.raises(Crash):
            start("sleeprec.sync", {"seconds": 2.0}, execution_id="sleeprec-2")
    # An orphan by the sweep's rule (last updated longer ago than grace + TTL), its sleep due in ~2 s still.
    Execution.objects.filter(pk="sleeprec-2").update(updated_at=timezone.now() - timedelta(minutes=5))
    monkeypatch.setattr(tasks, "BACKSTOP_REACH", OrphanReach())  # a full pass
    assert tasks.recovery_sweep() == 1
    _assert_once_and_done("sleeprec-2")


def test_an_async_run_resumed_on_the_loop_during_its_short_sleep_sleeps_the_rest_and_completes(monkeypatch):
    async def crash(_seconds: float) -> None:
        raise Crash("died during the sleep")

    with monkeypatch.context() as patch:
        patch.setattr(aio, "_sleep", crash)  # what the loop awaits for a short sleep
        with pytest.raises(Crash):
            async_to_sync(astart)("sleeprec.async", {"seconds": 1.0}, execution_id="sleeprec-3")
    assert _types("sleeprec-3")[-1] == "WAIT_STARTED"
    outcome = async_to_sync(aresume)("sleeprec-3", force=True)
    assert outcome.result == "ok"
    _assert_once_and_done("sleeprec-3")
