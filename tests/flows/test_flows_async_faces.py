"""Async callers: an async view starts an async flow and awaits its event with Django's AsyncClient; many
waiters of aget_event hold no thread (a pool of ONE thread serves 20 of them and the sender too); the awaitable
faces refuse bad input with the sync call's error; a queued start of an async flow runs on the queue runner.
SQLite and PostgreSQL (transactional tests: the pool's threads have sessions of their own)."""

from __future__ import annotations

import asyncio
import json

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient

from journal.flows import InvalidInput, UnknownExecution, get_event, start, wake_due
from journal.flows import ownership as own
from journal.flows.aio import acancel, adescribe, aget_event, aoutcome_of, asend, astart, in_pool
from journal.models import Execution, Message
from tests.conftest import effect_rows
from tests.fixtures import mode_flows as mf

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.urls("tests.fixtures.async_views")]


@pytest.fixture(autouse=True)
def _flows(settings, effects):
    settings.LOOM_FLOW_MODULES = ["tests.fixtures.mode_flows"]
    settings.LOOM_WAIT_INLINE_MAX = 0.0
    settings.LOOM_WAIT_POLL = 0.05
    settings.LOOM_ASYNC_DB_THREADS = 1  # one pool thread: a waiter that held it would starve everyone else
    # The site's middleware is sync-only (Django would run every request through one thread, in turn): the
    # views here are served async end to end, as under an ASGI server with async-capable middleware.
    settings.MIDDLEWARE = []
    installed = own.get_ownership()
    own.set_ownership(None)
    yield
    own.set_ownership(installed)


def test_an_async_view_starts_a_flow_and_awaits_its_event_while_it_is_sent_a_message():
    async def scenario():
        client = AsyncClient()
        started = await client.post("/start", json.dumps({"flow": "modes.async.talker", "input": {"n": 1},
                                                          "id": "av1"}), content_type="application/json")
        assert started.json() == {"execution_id": "av1", "status": "waiting"}

        async def deliver():
            await asyncio.sleep(0.2)  # the waiters are waiting by now (or not: they read it then)
            sent = await client.post("/send/av1", json.dumps({"topic": "in", "payload": 9, "id": "m1"}),
                                     content_type="application/json")
            assert sent.json() == {"message_id": "m1"}
            await in_pool(wake_due)  # the waker's work: the woken run publishes the event and settles

        waiters = [client.get("/event/av1/sum", {"wait": "30"}) for _ in range(20)]
        *answers, _ = await asyncio.gather(*waiters, deliver())
        assert [answer.json() for answer in answers] == [{"key": "sum", "value": 9}] * 20
        described = await client.get("/describe/av1")
        assert described.json()["status"] == "completed"

    async_to_sync(scenario)()
    assert Execution.objects.get(pk="av1").result == 9
    assert Message.objects.filter(execution_id="av1", consumed_at__isnull=False).count() == 1


def test_the_awaitable_faces_answer_as_the_sync_calls_do():
    async def scenario():
        out = await astart("modes.async.chain", {"n": 3}, "af1")
        assert (out.status, out.result) == ("completed", 3)
        assert (await aoutcome_of("af1")).result == 3
        assert (await adescribe("af1"))["status"] == "completed"
        assert await aget_event("af1", "nothing", timeout=0.1, default="d") == "d"
        with pytest.raises(UnknownExecution):
            await aget_event("missing", "k")
        with pytest.raises(InvalidInput):
            await aget_event("af1", "k", timeout=-1)
        with pytest.raises(InvalidInput):
            await astart("modes.async.chain", {"n": 3}, "bad id with spaces")
        waiting = await astart("modes.async.talker", {"n": 1}, "af2")
        assert waiting.status == "waiting"
        with pytest.raises(InvalidInput):
            await asend("af2", "bad topic", 1)
        assert (await acancel("af2", "no longer")).status == "cancelled"

    async_to_sync(scenario)()
    assert not Execution.objects.filter(pk="bad id with spaces").exists()
    assert Message.objects.filter(execution_id="af2").count() == 0


def test_a_queued_start_of_an_async_flow_is_run_by_the_queue_runner():
    from journal.flows import registry
    from queues.service import run_claimed
    from queues.store import store_for

    out = start("modes.async.effects", {}, execution_id="aq1", queue="default")
    assert out.status == "queued"
    mf.CRASH_PASSES["value"] = True
    for claimed in store_for().dequeue("default", "test-worker", 10, registry.runnable(), 3600.0) or []:
        run_claimed(claimed)
    assert Execution.objects.get(pk="aq1").status == "completed"
    assert [step for eid, step in effect_rows() if eid == "aq1"] == ["one", "two", "four"]
    assert get_event("aq1", "none", default=0) == 0


def _backend_pid() -> int:
    from django.db import connection as own

    with own.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


@pytest.mark.postgres
def test_a_pool_thread_whose_session_the_server_ended_connects_afresh():
    """A pool thread keeps its connection (CONN_MAX_AGE None, as a long-lived ASGI process may): after the
    server ends that session (a restart, a failover: pg_terminate_backend here), the next call on the thread
    succeeds with CONN_HEALTH_CHECKS, and without them the one call that met the dead session fails as
    unreachable and the one after succeeds: the thread is never stuck on the dead session."""
    from django.db import DatabaseError, connection

    from journal.flows import aio
    from journal.reach import cannot_reach

    saved = {k: connection.settings_dict[k] for k in ("CONN_MAX_AGE", "CONN_HEALTH_CHECKS")}

    def new_pool() -> None:  # a new thread: its connection opens under the settings now
        if aio._pool is not None:
            aio._pool.shutdown()
        aio._pool = None

    async def describe_missing() -> None:
        with pytest.raises(UnknownExecution):
            await adescribe("pool-missing")

    def end_pool_session() -> int:
        pid = async_to_sync(in_pool)(_backend_pid)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])  # returns once the backend is gone
            assert cursor.fetchone()[0] is True
        return pid

    try:
        for checks in (True, False):
            connection.settings_dict.update(CONN_MAX_AGE=None, CONN_HEALTH_CHECKS=checks)
            new_pool()
            async_to_sync(describe_missing)()
            pid = end_pool_session()
            if not checks:
                with pytest.raises(DatabaseError) as met:
                    async_to_sync(describe_missing)()
                assert cannot_reach(met.value)
            async_to_sync(describe_missing)()  # the same thread, a new session
            assert async_to_sync(in_pool)(_backend_pid) != pid
    finally:
        connection.settings_dict.update(saved)
        new_pool()
