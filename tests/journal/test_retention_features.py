"""Retention across features: the Tasks backend's results and their queue entries, the HTTP API (a removed
execution is unknown: 404), queued executions (never removed). Both backends."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from journal import retention
from journal.flows import start
from journal.models import Execution
from queues.models import QueueEntry
from tests.api.test_api import AUTH, TOKEN
from tests.fixtures import (
    flows_fixtures,  # noqa: F401  (test.add)
    queue_flows,
)
from tests.queues.test_tasks_backend import stop_the_process_lease_keeper, work  # noqa: F401

try:  # Django 6.x has Tasks; 5.2 the django-tasks backport
    from django.tasks.exceptions import TaskResultDoesNotExist
except ImportError:  # pragma: no cover - Django 5.2
    from django_tasks.exceptions import TaskResultDoesNotExist

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _retention(settings):
    settings.LOOM_RETENTION_DAYS = 30
    settings.LOOM_API_AUTH = True
    settings.LOOM_API_TOKENS = [TOKEN]


def age(execution_id: str, days: float = 40) -> None:
    Execution.objects.filter(pk=execution_id).update(finished_at=timezone.now() - timedelta(days=days))


def test_a_removed_task_result_does_not_exist_and_its_queue_entry_goes_while_a_queued_one_stays():
    done = queue_flows.add.enqueue(2, 3)
    assert work() == ["completed"]
    waiting = queue_flows.add.enqueue(4, 5)  # queued, not begun: never due whatever its age
    Execution.objects.filter(pk=waiting.id).update(created_at=timezone.now() - timedelta(days=400))
    age(done.id)
    assert QueueEntry.objects.filter(execution_id=done.id).exists()

    assert retention.run("default")["executions"] == 1

    with pytest.raises(TaskResultDoesNotExist):
        queue_flows.add.get_result(done.id)
    assert not QueueEntry.objects.filter(execution_id=done.id).exists()
    assert Execution.objects.get(pk=waiting.id).status == "queued"
    assert QueueEntry.objects.filter(execution_id=waiting.id, state="pending").exists()
    assert work() == ["completed"]  # the queued one still runs
    assert queue_flows.add.get_result(waiting.id).return_value == 9


def test_the_http_api_answers_a_removed_execution_as_unknown(client):
    start("test.add", {"a": 1, "b": 2}, execution_id="rh-1")
    assert client.get("/api/executions/rh-1", headers=AUTH).json()["status"] == "completed"
    age("rh-1")
    assert retention.run("default")["executions"] == 1
    response = client.get("/api/executions/rh-1", headers=AUTH)
    assert response.status_code == 404 and response.json()["error"]["code"] == "unknown_execution"
