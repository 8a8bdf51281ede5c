"""Queued starts and Django tasks from async views (Django's AsyncClient, tests/fixtures/async_views.py):
queues.aenqueue, acancel_pending and aentry_of, and the Tasks backend's aenqueue / aget_result / arefresh, across
features: a start enqueued from an async view and cancelled before it runs never runs and is listed as cancelled by
the API; a queued start whose subject is forgotten leaves no plaintext anywhere (its entry row included) and its run
never gets the value; a task enqueued from an async view is run by the queue runner and read back, and one cancelled
before it runs reads as failed. The views run on the loop, so any database access there would raise
SynchronousOnlyOperation. SQLite and PostgreSQL (transactional tests: the faces' pool threads have sessions of their
own)."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient

from journal.flows import describe, registry
from journal.models import Execution
from queues import UnknownQueue
from queues.aio import aenqueue
from queues.models import QueueEntry
from queues.service import run_claimed
from queues.store import store_for
from tests.fixtures import privacy_fixtures as fx
from tests.fixtures import queue_flows  # noqa: F401  (registers the flows and tasks)
from tests.queues.test_queued_executions import database_bytes, steps_run

try:
    from django.tasks import TaskResultStatus
except ImportError:  # Django 5.2: the backport
    from django_tasks import TaskResultStatus

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.urls("tests.fixtures.async_views")]
TOKEN = "ops-token-async-0123456789abcdef"


@pytest.fixture(autouse=True)
def _setup(settings):
    settings.MIDDLEWARE = []  # served async end to end (the site's middleware is sync-only: docs/flows.md)
    settings.LOOM_ASYNC_DB_THREADS = 2
    settings.LOOM_API_AUTH = True
    settings.LOOM_API_TOKENS = [{"token": TOKEN, "name": "ops"}]


@pytest.fixture(autouse=True, scope="module")
def stop_the_process_lease_keeper():
    yield
    from leases.keeper import get_keeper, reset_keeper

    get_keeper().shutdown()
    reset_keeper(None)


def work(queue: str = "default") -> list[str]:
    """What a worker's dispatcher does: claim the queue's due entries and run each (their outcomes)."""
    claimed = store_for().dequeue(queue, "test-worker", 100, sorted(registry.registered()), 3600.0)
    return [run_claimed(entry) for entry in claimed or []]


def listed(client) -> dict[str, str]:
    """The API's listing (GET /api/executions) as {execution id: status}."""
    answer = client.get("/api/executions", headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 200, answer.content
    return {row["execution_id"]: row["status"] for row in answer.json()["executions"]}


def post(client: AsyncClient, path: str, body: dict):
    return client.post(path, json.dumps(body), content_type="application/json")


def test_a_start_enqueued_from_an_async_view_and_cancelled_before_it_runs_never_runs(client):
    async def enqueue_two():
        aclient = AsyncClient()
        for eid in ("qas-1", "qas-2"):
            answer = await post(aclient, "/enqueue", {"flow": "queues.test.double", "input": {"n": 3}, "id": eid})
            assert answer.json() == {"execution_id": eid, "created": True, "queue": "default"}
        again = await post(aclient, "/enqueue", {"flow": "queues.test.double", "input": {"n": 3}, "id": "qas-1"})
        assert again.json()["created"] is False  # the same start again: nothing new written
        assert (await aclient.get("/entry/qas-1")).json()["entry"] == {"state": "pending", "queue": "default",
                                                                      "input": {"n": 3}}

    async def cancel_one():
        aclient = AsyncClient()
        assert (await aclient.post("/cancel-pending/qas-1")).json() == {"cancelled": True}
        assert (await aclient.post("/cancel-pending/qas-1")).json() == {"cancelled": False}  # nothing left to cancel
        assert (await aclient.post("/cancel-pending/no-such")).json() == {"cancelled": False}
        assert (await aclient.get("/entry/qas-1")).json()["entry"]["state"] == "cancelled"

    async_to_sync(enqueue_two)()
    assert {k: v for k, v in listed(client).items() if k.startswith("qas-")} == {"qas-1": "queued", "qas-2": "queued"}
    async_to_sync(cancel_one)()
    assert work() == ["completed"]  # qas-2 only: the cancelled start is never begun
    assert steps_run("qas-1") == 0 and Execution.objects.get(pk="qas-2").result == 6
    assert {k: v for k, v in listed(client).items() if k.startswith("qas-")} == {"qas-1": "cancelled",
                                                                                  "qas-2": "completed"}
    assert describe("qas-1")["error"] == "cancelled before it began"


def test_a_start_enqueued_from_an_async_view_whose_subject_is_forgotten_keeps_no_plaintext(settings, tmp_path):
    from journal.privacy import forget, keys

    settings.LOOM_KEYS = [fx.KEY_A]
    settings.LOOM_CONTENT_DIR = str(tmp_path / "content")
    keys.cache.clear()
    secret = "async-queued-secret-0815@example.org"

    async def enqueue_it():
        aclient = AsyncClient()
        answer = await post(aclient, "/enqueue", {"flow": "queues.test.seen", "id": "qaf-1",
                                                  "input": {"customer_id": "c-aq1", "email": secret}})
        assert answer.json()["created"] is True
        return (await aclient.get("/entry/qaf-1")).json()["entry"]

    try:
        entry = async_to_sync(enqueue_it)()
        assert entry["state"] == "pending" and secret not in json.dumps(entry)  # the row holds it withheld
        forget("c-aq1", by="dpo")
        assert secret not in database_bytes()
        assert work() == ["completed"]
        seen = Execution.objects.get(pk="qaf-1").result["seen"]
        assert secret not in seen  # the run read its input from the log, after the forget: never the value
        assert secret not in database_bytes()
    finally:
        keys.cache.clear()


def test_a_task_enqueued_from_an_async_view_runs_and_is_read_back_and_one_cancelled_first_fails(client, settings):
    async def enqueue_tasks():
        aclient = AsyncClient()
        first = (await post(aclient, "/task", {"args": [4, 5]})).json()
        second = (await post(aclient, "/task", {"args": [1, 1]})).json()
        assert first["status"] == second["status"] == str(TaskResultStatus.READY)
        assert (await aclient.get(f"/task/{first['id']}")).json() == {"status": str(TaskResultStatus.READY),
                                                                     "value": None, "errors": 0}
        assert (await aclient.post(f"/cancel-pending/{second['id']}")).json() == {"cancelled": True}
        return first["id"], second["id"]

    async def read(result_id: str) -> dict:
        return (await AsyncClient().get(f"/task/{result_id}")).json()

    first, second = async_to_sync(enqueue_tasks)()
    assert first not in listed(client)  # loom.task is internal: no token sees it unless it is exposed
    settings.LOOM_EXPOSED_INTERNAL_FLOWS = ["loom.task"]
    assert listed(client)[first] == "queued" and listed(client)[second] == "cancelled"
    assert work() == ["completed"]
    assert async_to_sync(read)(first) == {"status": str(TaskResultStatus.SUCCESSFUL), "value": 9, "errors": 0}
    assert async_to_sync(read)(second)["status"] == str(TaskResultStatus.FAILED)
    assert QueueEntry.objects.get(execution_id=second).state == "cancelled" and steps_run(second) == 0


def test_aenqueue_refuses_what_enqueue_refuses_and_writes_nothing():
    async def refused():
        with pytest.raises(UnknownQueue):
            await aenqueue("queues.test.double", {"n": 1}, queue="", execution_id="qar-1")

    async_to_sync(refused)()
    assert not Execution.objects.filter(pk="qar-1").exists() and not QueueEntry.objects.exists()
