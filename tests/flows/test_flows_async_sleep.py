"""An async flow driven from the loop (astart, aresume) holds no thread and no connection while it sleeps in-process
(a sleep shorter than LOOM_WAIT_INLINE_MAX): 50 of them asleep at once leave the pool idle, the other async faces
and another astart get a pool thread meanwhile, and each completes with the events a thread-driven run writes
(2n + 2), its steps run once. A cancel or a forget during such a sleep, and a SIGKILL of the process that drives
them (recovered by a worker), keep the sync runtime's rules. SQLite and PostgreSQL (transactional tests: the pool's
threads have sessions of their own).

The sleeps are held at a gate (aio._sleep replaced) so that the counts are taken while every run is asleep, with no
timing in the test; the threads, pool calls and sessions counted are the real ones."""

from __future__ import annotations

import asyncio
import collections
import gc
import threading

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import connection

from journal.flows import RetryPolicy, aio, describe, flow
from journal.flows.aio import acancel, adescribe, aget_event, astart
from journal.models import Event, Execution
from tests.conftest import effect_rows
from tests.fixtures import mode_flows as mf  # (registers the flows too)
from tests.fixtures import privacy_fixtures as pf
from tests.flows import async_sleep_flows  # noqa: F401 (registers the flows)
from tests.privacy.test_privacy import raw_rows

pytestmark = pytest.mark.django_db(transaction=True)


@flow("asleep.marked", input_model=pf.Signup)
async def marked(ctx, value: pf.Signup):
    """A marked input and a marked step result on both sides of a short sleep."""

    async def greet() -> dict:
        return {"customer_id": value.customer_id, "text": f"hi {value.email}"}

    await ctx.step("privacy.greet", greet)
    await ctx.sleep(5)
    again = await ctx.step("privacy.greet", greet)
    return {"greeted": bool(again["text"])}


_failed_once: set[str] = set()


async def _fails_once(key: str) -> str:
    if key not in _failed_once:
        _failed_once.add(key)
        raise ConnectionError(f"{key}: first attempt")
    return "ok"


@flow("asleep.backoff", retry=RetryPolicy(attempts=2, backoff=5))
async def backoff(ctx, value):
    """A step whose first attempt fails: its retry waits a backoff of 5 s (in-process under LOOM_WAIT_INLINE_MAX)."""
    return await ctx.step("flaky", _fails_once, ctx.execution_id)


@flow("asleep.backoff_short", retry=RetryPolicy(attempts=2, backoff=0.01))
async def backoff_short(ctx, value):
    return await ctx.step("flaky", _fails_once, ctx.execution_id)


IO_GATE = None  # set by a test: the Gate that the coroutine step below awaits (an I/O call in flight)
in_io: list[str] = []


@flow("asleep.io")
async def io(ctx, value):
    """One coroutine step that awaits I/O (the test's gate) and returns."""

    async def call() -> str:
        in_io.append(ctx.execution_id)
        await IO_GATE.sleep(0)
        return "answered"

    return await ctx.step("call", call)


POOL = 4
RUNS = 50


@pytest.fixture(autouse=True)
def _flows(settings, effects, tmp_path):
    settings.LOOM_FLOW_MODULES = ["tests.fixtures.mode_flows", "tests.fixtures.privacy_fixtures",
                                  "tests.flows.async_sleep_flows"]
    settings.LOOM_WAIT_INLINE_MAX = 30.0  # the 5 s sleeps below are in-process: they do not park
    settings.LOOM_WAIT_POLL = 0.05
    settings.LOOM_ASYNC_DB_THREADS = POOL
    with pf.keyed_without_keeper(settings, tmp_path):
        yield


class Gate:
    """Holds every in-process sleep of a loop-driven run until opened (what aio.nap awaits)."""

    def __init__(self):
        self.event: asyncio.Event | None = None
        self.opened = False

    async def sleep(self, seconds: float) -> None:
        if self.event is None:
            self.event = asyncio.Event()  # on the process loop, where every nap runs
        if not self.opened:
            await self.event.wait()

    def open(self) -> None:
        def release() -> None:
            self.opened = True
            if self.event is not None:
                self.event.set()

        aio.loop().call_soon_threadsafe(release)


@pytest.fixture
def gate(monkeypatch) -> Gate:
    held = Gate()
    monkeypatch.setattr(aio, "_sleep", held.sleep)
    yield held
    held.open()


def sessions() -> int:
    """Database sessions open now: this process's open Django connections, in every thread (SQLite's file handles
    would over-count: it keeps a closed connection's descriptor while another holds a lock), and on PostgreSQL
    the server's own count of sessions on the test database, whichever is larger."""
    from django.db.backends.base.base import BaseDatabaseWrapper

    # type(), not isinstance(): isinstance would evaluate every lazy object on the heap (a test client's lazy
    # resolver match of an earlier test among them).
    here = sum(1 for each in gc.get_objects()
               if issubclass(type(each), BaseDatabaseWrapper) and each.connection is not None)
    if connection.vendor != "postgresql":
        return here
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
        return max(here, cursor.fetchone()[0])


async def until(predicate, what: str) -> None:
    """Wait (on the loop) until `predicate()`; a failure after a generous bound says what never happened."""
    for _ in range(6000):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"never: {what} ({aio.stats()})")


def loop_threads() -> int:
    return sum(1 for thread in threading.enumerate() if thread.name.startswith(("loom-adb", "loom-aio")))


def test_fifty_async_runs_in_a_short_sleep_hold_no_thread_and_no_session_and_each_completes_once(gate):
    ids = [f"as-{i:02d}" for i in range(RUNS)]

    async def scenario():
        warm = await astart("modes.async.chain", {"n": 1}, "as-warm")  # the loop and the pool exist from here
        assert warm.status == "completed"
        threads_before, sessions_before = threading.active_count(), await sync_to_async(sessions)()
        runs = [asyncio.ensure_future(astart("modes.async.sleeper", {"seconds": 5}, eid)) for eid in ids]
        await until(lambda: aio.stats()["napping"] == RUNS, f"all {RUNS} runs asleep")
        held = aio.stats()
        threads_asleep, sessions_asleep = threading.active_count(), await sync_to_async(sessions)()
        assert held["pool_busy"] == 0 and held["pool_threads"] <= POOL  # no pool thread is held by a sleeper
        # 50 runs asleep: a few threads and sessions more at most (the pool's, the journal's write coalescers
        # started on first use), where a thread per sleeping run would be 50 more of each.
        assert threads_asleep - threads_before < 10
        assert sessions_asleep - sessions_before < 10
        assert loop_threads() <= POOL + 1
        assert not any(run.done() for run in runs)
        # The other faces get a pool thread while the 50 sleep: a sync call's face, an event wait, another start.
        assert (await adescribe(ids[0]))["status"] == "running"
        assert await aget_event(ids[0], "nothing", timeout=0.1, default="d") == "d"
        other = await astart("modes.async.chain", {"n": 2}, "as-other")
        assert (other.status, other.result) == ("completed", 0 + 1)
        assert (await sync_to_async(describe)(ids[1]))["status"] == "running"  # the sync face, in the test thread
        gate.open()
        return await asyncio.gather(*runs)

    outcomes = async_to_sync(scenario)()
    assert {(out.status, out.result) for out in outcomes} == {("completed", "after")}
    for eid in ids:
        assert len(Event.objects.read(eid)) == 2 * 3 + 2  # two steps and the sleep: 2n + 2
    counts = collections.Counter(effect_rows())
    assert counts == {(eid, step): 1 for eid in ids for step in ("before", "after")}
    assert Execution.objects.filter(pk__in=ids, status="completed").count() == RUNS


VOLATILE = {"ms", "due_at", "deadline", "at", "started_at"}


def _events(execution_id: str) -> list[tuple[str, dict]]:
    return [(e.type, {k: v for k, v in e.payload.items() if k not in VOLATILE})
            for e in Event.objects.read(execution_id)]


def test_a_loop_driven_run_writes_the_events_a_thread_driven_run_writes():
    from journal.flows import start

    threaded = start("modes.async.sleeper", {"seconds": 0.01}, execution_id="ae-thread")  # this thread drives it
    looped = async_to_sync(astart)("modes.async.sleeper", {"seconds": 0.01}, "ae-loop")
    assert (threaded.status, threaded.result) == (looped.status, looped.result) == ("completed", "after")
    assert _events("ae-thread") == _events("ae-loop")
    assert [e.type for e in Event.objects.read("ae-loop")][3:5] == ["WAIT_STARTED", "STEP_COMPLETED"]
    assert Execution.objects.get(pk="ae-loop").status == "completed"


def test_a_resume_before_a_scheduled_start_is_due_sleeps_the_rest_on_the_loop(gate):
    from journal.flows import start

    assert start("modes.async.chain", {"n": 2}, execution_id="ast-1", delay=3).status == "waiting"  # scheduled

    async def scenario():
        run = asyncio.ensure_future(aio.aresume("ast-1"))  # early: the 3 s left are under LOOM_WAIT_INLINE_MAX
        await until(lambda: aio.stats()["napping"] == 1, "the resumed run asleep until its start time")
        held = aio.stats()
        gate.open()
        return held, await run

    held, out = async_to_sync(scenario)()
    assert held["pool_busy"] == 0
    assert (out.status, out.result) == ("completed", 1)
    assert len(Event.objects.read("ast-1")) == 2 * 2 + 2


def test_a_cancel_during_a_short_async_sleep_stops_the_run_before_its_next_step(gate):
    async def scenario():
        run = asyncio.ensure_future(astart("modes.async.sleeper", {"seconds": 5}, "acn-1"))
        await until(lambda: aio.stats()["napping"] == 1, "the run asleep")
        cancelled = await acancel("acn-1", "operator")
        assert cancelled.status == "cancelled"
        gate.open()
        return await run

    out = async_to_sync(scenario)()
    assert (out.status, out.error) == ("cancelled", "operator")
    assert effect_rows() == [("acn-1", "before")]  # the step after the sleep never ran
    types = [e.type for e in Event.objects.read("acn-1")]
    assert types[-1] == "EXECUTION_CANCELLED" and types.count("STEP_STARTED") == 1
    assert Execution.objects.get(pk="acn-1").status == "cancelled"


def test_a_forget_during_a_short_async_sleep_leaves_no_clear_value_behind(gate):
    from journal.privacy import forget
    from journal.privacy.codec import FORGOTTEN

    async def scenario():
        run = asyncio.ensure_future(astart("asleep.marked", {"customer_id": "af-s", "email": "nap@example.org"},
                                           "afg-1"))
        await until(lambda: aio.stats()["napping"] == 1, "the run asleep")
        await sync_to_async(forget)("af-s", by="dpo@example.org")
        gate.open()
        return await run

    out = async_to_sync(scenario)()
    # The run goes on with what it holds in memory (as a thread-driven run does); what it writes after the forget
    # is sealed for the forgotten subject and reads back as FORGOTTEN, like what it wrote before.
    assert (out.status, out.result) == ("completed", {"greeted": True})
    assert "nap@example.org" not in raw_rows()
    info = describe("afg-1")
    assert info["input"]["email"] == FORGOTTEN
    greetings = [step for step in info["steps"] if step.get("name", step.get("step")) == "privacy.greet"]
    assert len(greetings) == 2 and all(step["result"]["text"] == FORGOTTEN for step in greetings), info["steps"]
    assert "nap@example.org" not in repr(info)


def test_a_short_retry_backoff_of_a_loop_driven_run_is_slept_on_the_loop(gate):
    async def scenario():
        run = asyncio.ensure_future(astart("asleep.backoff", {}, "abk-1"))
        await until(lambda: aio.stats()["napping"] == 1, "the run asleep in its step's backoff")
        held = aio.stats()
        gate.open()
        return held, await run

    held, out = async_to_sync(scenario)()
    assert held["pool_busy"] == 0  # the step's call let its pool thread go for the backoff
    assert (out.status, out.result) == ("completed", "ok")
    types = [e.type for e in Event.objects.read("abk-1")]
    assert types == ["EXECUTION_STARTED", "STEP_STARTED", "STEP_FAILED", "STEP_STARTED", "STEP_COMPLETED",
                     "EXECUTION_COMPLETED"]


def test_a_retried_step_writes_the_same_events_driven_from_the_loop_or_a_thread():
    from journal.flows import start

    threaded = start("asleep.backoff_short", {}, execution_id="abs-thread")
    looped = async_to_sync(astart)("asleep.backoff_short", {}, "abs-loop")
    assert (threaded.status, threaded.result) == (looped.status, looped.result) == ("completed", "ok")
    strip = {"error", "traceback"}  # they name the execution
    assert ([(t, {k: v for k, v in p.items() if k not in strip}) for t, p in _events("abs-thread")]
            == [(t, {k: v for k, v in p.items() if k not in strip}) for t, p in _events("abs-loop")])


def test_fifty_loop_driven_runs_in_a_coroutine_step_hold_no_pool_thread_and_each_step_runs_once():
    global IO_GATE
    IO_GATE = Gate()
    in_io.clear()
    ids = [f"aio-{i:02d}" for i in range(RUNS)]

    async def scenario():
        runs = [asyncio.ensure_future(astart("asleep.io", {}, eid)) for eid in ids]
        await until(lambda: len(in_io) == RUNS, f"all {RUNS} runs in their step")
        held = aio.stats()
        assert (await adescribe(ids[0]))["status"] == "running"  # the faces are served meanwhile
        IO_GATE.open()
        return held, await asyncio.gather(*runs)

    try:
        held, outcomes = async_to_sync(scenario)()
    finally:
        IO_GATE.open()
    assert held["pool_busy"] == 0  # 50 coroutine steps in flight: none holds a pool thread
    assert {(out.status, out.result) for out in outcomes} == {("completed", "answered")}
    assert sorted(in_io) == ids  # each step's function ran once
    for eid in ids:
        assert [e.type for e in Event.objects.read(eid)] == ["EXECUTION_STARTED", "STEP_STARTED", "STEP_COMPLETED",
                                                            "EXECUTION_COMPLETED"]


def test_a_loop_driven_coroutine_step_past_its_timeout_is_told_and_fails_as_a_thread_driven_one():
    from journal.flows import start

    mf.TOLD.clear()
    threaded = start("modes.async.told", {}, execution_id="atl-thread")
    looped = async_to_sync(astart)("modes.async.told", {}, "atl-loop")
    assert threaded.status == looped.status == "failed" and "deadline exceeded" in looped.error
    assert sorted(mf.TOLD) == ["atl-loop", "atl-thread"]  # ctx.cancelled() turned True inside either
    assert [t for t, _ in _events("atl-thread")] == [t for t, _ in _events("atl-loop")]
