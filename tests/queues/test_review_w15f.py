"""Review (wave 15, engineer f): the operator's console meets bad input. A NUL in a POSTed name
reached PostgreSQL (DataError: text fields cannot hold NUL) and the admin answered 500 instead of naming the
refusal; nothing may be written. Both databases (a NUL is refused the same way on SQLite)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from leases.models import DrainRequest, Schedule
from queues.models import Queue

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/admin/queues/queue/operations/"
ACTIONS = ("pause_queue", "resume_queue", "drain_worker", "run_schedule", "pause_schedule", "resume_schedule",
           "backfill_schedule")


@pytest.fixture
def operator() -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(User.objects.create_superuser("rev-f-op", "op@example.com", "x"))
    return client


@pytest.mark.parametrize("action", ACTIONS)
def test_a_nul_in_a_posted_name_is_refused_by_name_and_writes_nothing(operator, action):
    before = (list(Queue.objects.values_list("name", "paused_at")), DrainRequest.objects.count(),
              list(Schedule.objects.values_list("name", "paused_at")))
    answer = operator.post(URL, {"action": action, "name": "rev\x00f", "start": "2026-01-01T00:00",
                                 "end": "2026-01-01T01:00"}, follow=True)
    assert answer.status_code == 200
    said = [str(m) for m in answer.context["messages"]]
    assert any("nothing done" in m for m in said), said
    assert (list(Queue.objects.values_list("name", "paused_at")), DrainRequest.objects.count(),
            list(Schedule.objects.values_list("name", "paused_at"))) == before

