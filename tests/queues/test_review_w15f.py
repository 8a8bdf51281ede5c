"""Review (wave 15, engineer f): the operator's console meets bad input. A NUL in a POSTed name
reached PostgreSQL (DataError: text fields cannot hold NUL) and the admin answered 500 instead of naming the
refusal; nothing may be written. A backfill range at the calendar's ends (year 1, 9999) gave an OverflowError (the
page's 500, the CLI's traceback). Both databases."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client

from leases.models import DrainRequest, Schedule
from queues.models import Queue
from tests.fixtures import schedule_flows  # noqa: F401  (sched.echo)

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



@pytest.mark.parametrize(("start", "end"), [("0001-01-01T00:00", "0001-01-01T03:00"),
                                            ("9999-12-31T22:00", "9999-12-31T23:59")])
def test_a_backfill_at_the_ends_of_the_calendar_is_refused_by_name(operator, start, end):
    from leases import schedules as sc

    sc.define("rev-f-hourly", "0 * * * *", "sched.echo", {"n": 1})
    answer = operator.post(URL, {"action": "backfill_schedule", "name": "rev-f-hourly", "start": start, "end": end},
                           follow=True)
    assert answer.status_code == 200
    said = [str(m) for m in answer.context["messages"]]
    assert len(said) == 1 and ("nothing done" in said[0] or "queued" in said[0]), said
    with pytest.raises(CommandError, match="calendar"):  # the CLI's refusal (exit 1), not an OverflowError
        call_command("loom", "schedules", "backfill", "rev-f-hourly", "--from", start, "--to", end)
