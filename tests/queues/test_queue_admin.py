"""The schedule and queue pages and the executions list's new filters, through the test client (the
clicks themselves are in tests/queues/test_queue_admin_browser.py): a refused definition writes nothing and
says why, an edit keeps the next tick, the filters select by schedule id and queue entry."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from journal.flows import ownership as own
from journal.flows import start
from leases import schedules as sc
from leases.models import Schedule
from tests.fixtures import schedule_flows  # noqa: F401

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client, settings):
    settings.LOOM_FLOW_MODULES = ["tests.fixtures.schedule_flows"]
    installed = own.get_ownership()
    own.set_ownership(None)
    User.objects.create_superuser("op", "op@example.com", "pw")
    client.force_login(User.objects.get(username="op"))
    yield client
    own.set_ownership(installed)


def form(**fields) -> dict:
    return {"name": "nightly", "cron": "0 3 * * *", "timezone": "UTC", "flow": "sched.echo",
            "input": '{"full": true}', "catch_up": "skip", "queue": "", "enabled": "on", **fields}


@pytest.mark.parametrize(("field", "value", "error"), [
    ("cron", "0 3 * *", "InvalidSchedule"), ("cron", "0 25 * * *", "InvalidSchedule"),
    ("flow", "no.such.flow", "UnknownFlow"), ("name", "bad name", "InvalidSchedule"),
    ("queue", "no-such-queue", "InvalidSchedule"), ("timezone", "Mars/Olympus", "InvalidSchedule"),
    ("timezone", "europe/paris", "InvalidSchedule"), ("timezone", "localtime", "InvalidSchedule"),
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


def test_a_schedule_in_a_time_zone_is_made_in_the_admin_which_shows_the_zone_and_its_local_next_tick(admin_client):
    """09:00 in Paris every weekday: the row keeps the zone, the next tick is 09:00 Paris time (stored in
    UTC), the list shows the zone and the next tick in UTC and in Paris; a new zone moves the tick."""
    from datetime import UTC
    from zoneinfo import ZoneInfo

    response = admin_client.post("/admin/leases/schedule/add/", form(cron="0 9 * * 1-5", timezone="Europe/Paris"))
    assert response.status_code == 302
    row = Schedule.objects.get(pk="nightly")
    local = row.next_tick_at.astimezone(ZoneInfo("Europe/Paris"))
    assert (row.timezone, local.hour, local.minute) == ("Europe/Paris", 9, 0)
    assert row.next_tick_at.astimezone(UTC).hour in (7, 8)  # CEST, CET
    page = admin_client.get("/admin/leases/schedule/").content.decode()
    assert "Europe/Paris" in page and f"{local:%Y-%m-%d} 09:00:00 {local:%Z} Europe/Paris" in page
    change = admin_client.get("/admin/leases/schedule/nightly/change/").content.decode()
    assert 'value="Europe/Paris"' in change
    admin_client.post("/admin/leases/schedule/nightly/change/", form(cron="0 9 * * 1-5", timezone="Asia/Tokyo"))
    moved = Schedule.objects.get(pk="nightly")
    assert moved.timezone == "Asia/Tokyo" and moved.next_tick_at.astimezone(ZoneInfo("Asia/Tokyo")).hour == 9


def test_executions_filter_by_schedule_and_by_queue(admin_client):
    from queues import declare_queue, enqueue, run_due
    from queues.declarations import forget

    sc.define("hourly", "0 * * * *", "sched.echo")
    start("sched.echo", {}, execution_id="sched:hourly:2026-12-01T10:00:00Z")
    start("sched.echo", {}, execution_id="plain-run")
    declare_queue("adm-q", concurrency=2)
    try:
        enqueue("sched.echo", {"q": 1}, queue="adm-q", execution_id="queued-run")
        run_due()  # a worker begins it (issue #24: the queued execution exists already; start() would refuse)
        by_schedule = admin_client.get("/admin/journal/execution/?schedule=hourly").content.decode()
        assert "sched:hourly:2026-12-01T10:00:00Z" in by_schedule and "plain-run" not in by_schedule
        by_queue = admin_client.get("/admin/journal/execution/?queue=adm-q").content.decode()
        assert "queued-run" in by_queue and "plain-run" not in by_queue
        queue_page = admin_client.get("/admin/queues/queue/").content.decode()
        assert "adm-q" in queue_page and "executions of adm-q" in queue_page
    finally:
        forget("adm-q")
