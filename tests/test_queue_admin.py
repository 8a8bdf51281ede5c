"""The schedule and queue pages and the executions list's new filters, through the test client (the
clicks themselves are in tests/test_queue_admin_browser.py): a refused definition writes nothing and
says why, an edit keeps the next tick, the filters select by schedule id and queue entry."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from journal.flows import ownership as own
from journal.flows import start
from leases import schedules as sc
from leases.models import Schedule
from tests import schedule_flows  # noqa: F401

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client, settings):
    settings.LOOM_FLOW_MODULES = ["tests.schedule_flows"]
    installed = own.get_ownership()
    own.set_ownership(None)
    User.objects.create_superuser("op", "op@example.com", "pw")
    client.force_login(User.objects.get(username="op"))
    yield client
    own.set_ownership(installed)


def form(**fields) -> dict:
    return {"name": "nightly", "cron": "0 3 * * *", "flow": "sched.echo", "input": '{"full": true}',
            "catch_up": "skip", "queue": "", "enabled": "on", **fields}


@pytest.mark.parametrize(("field", "value", "error"), [
    ("cron", "0 3 * *", "InvalidSchedule"), ("cron", "0 25 * * *", "InvalidSchedule"),
    ("flow", "no.such.flow", "UnknownFlow"), ("name", "bad name", "InvalidSchedule"),
    ("queue", "no-such-queue", "InvalidSchedule"),
])
def test_a_refused_schedule_is_not_written_and_the_form_says_why(admin_client, field, value, error):
    response = admin_client.post("/admin/leases/schedule/add/", form(**{field: value}))
    assert response.status_code == 200 and error in response.content.decode()
    assert not Schedule.objects.exists()


def test_a_schedule_added_and_edited_in_the_admin_keeps_its_next_tick(admin_client):
    response = admin_client.post("/admin/leases/schedule/add/", form())
    assert response.status_code == 302
    row = Schedule.objects.get(pk="nightly")
    assert (row.cron, row.input, row.source, row.next_tick_at.hour) == ("0 3 * * *", {"full": True}, "admin", 3)
    response = admin_client.post("/admin/leases/schedule/nightly/change/", form(input='{"full": false}',
                                                                                  catch_up="all"))
    assert response.status_code == 302
    edited = Schedule.objects.get(pk="nightly")
    assert (edited.input, edited.catch_up, edited.next_tick_at) == ({"full": False}, "all", row.next_tick_at)
    page = admin_client.get("/admin/leases/schedule/").content.decode()
    assert "nightly" in page and "all" in page


def test_executions_filter_by_schedule_and_by_queue(admin_client):
    from queues import declare_queue, enqueue
    from queues.declarations import forget

    sc.define("hourly", "0 * * * *", "sched.echo")
    start("sched.echo", {}, execution_id="sched:hourly:2026-12-01T10:00:00Z")
    start("sched.echo", {}, execution_id="plain-run")
    declare_queue("adm-q", concurrency=2)
    try:
        enqueue("sched.echo", {"q": 1}, queue="adm-q", execution_id="queued-run")
        start("sched.echo", {"q": 1}, execution_id="queued-run")
        by_schedule = admin_client.get("/admin/journal/execution/?schedule=hourly").content.decode()
        assert "sched:hourly:2026-12-01T10:00:00Z" in by_schedule and "plain-run" not in by_schedule
        by_queue = admin_client.get("/admin/journal/execution/?queue=adm-q").content.decode()
        assert "queued-run" in by_queue and "plain-run" not in by_queue
        queue_page = admin_client.get("/admin/queues/queue/").content.decode()
        assert "adm-q" in queue_page and "executions of adm-q" in queue_page
    finally:
        forget("adm-q")
