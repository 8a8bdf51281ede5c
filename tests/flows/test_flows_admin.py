"""The journal admin: executions filterable by status and flow, a page with the timeline, fence and
snapshot, read-only events, and resume/cancel actions that go through the runtime."""

from __future__ import annotations

import pytest

from journal.flows import ownership as own
from journal.flows import start
from journal.models import Event, Execution
from tests.fixtures import flows_fixtures as fx

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _flows(settings):
    settings.LOOM_FLOW_MODULES = ["tests.fixtures.flows_fixtures"]
    fx.CRASH_PASSES = False
    installed = own.get_ownership()
    own.set_ownership(None)
    yield
    own.set_ownership(installed)


def test_execution_list_filters_by_status_and_flow(admin_client):
    start("test.add", {"a": 1, "b": 1}, execution_id="adm-ok")
    start("test.retry", {"key": "adm", "fail": 9, "attempts": 1}, execution_id="adm-failed")
    page = admin_client.get("/admin/journal/execution/", {"status__exact": "failed"})
    assert page.status_code == 200
    assert b"adm-failed" in page.content and b"adm-ok" not in page.content
    page = admin_client.get("/admin/journal/execution/", {"flow": "test.add"})
    assert b"adm-ok" in page.content and b"adm-failed" not in page.content


def test_execution_page_shows_timeline_fence_snapshot_and_events(admin_client, settings):
    settings.LOOM_SNAPSHOT_EVERY = 2
    start("test.retry", {"key": "adm2", "fail": 1, "attempts": 2}, execution_id="adm-page")
    page = admin_client.get("/admin/journal/execution/adm-page/change/")
    body = page.content.decode()
    assert page.status_code == 200
    for text in ("Timeline", "retrying", "RuntimeError: attempt 1 of adm2 fails", "Current fence",
                 "at seq 5 of 6 events", "EXECUTION_COMPLETED", "STEP_FAILED"):
        assert text in body
    assert 'name="_save"' not in body  # read-only page


def test_events_cannot_be_added_changed_or_deleted_in_the_admin(admin_client):
    start("test.add", {"a": 1, "b": 1}, execution_id="adm-ev")
    event = Event.objects.filter(stream_id="adm-ev").first()
    assert admin_client.get("/admin/journal/event/add/").status_code == 403
    assert admin_client.get(f"/admin/journal/event/{event.pk}/delete/").status_code == 403
    page = admin_client.get(f"/admin/journal/event/{event.pk}/change/")
    assert page.status_code == 200 and 'name="_save"' not in page.content.decode()


def test_cancel_and_resume_buttons_go_through_the_runtime(admin_client):
    """Resume hands the run to a worker (the queued task runs it); cancel confirms, then records."""
    from tests.admin.test_admin_executions import run_queued

    with pytest.raises(fx.Crash):
        start("test.crashing", {}, execution_id="adm-run")
    fx.CRASH_PASSES = True
    response = admin_client.post("/admin/journal/execution/adm-run/resume/")
    assert response.status_code == 302
    assert Execution.objects.get(pk="adm-run").status == "running"  # not run in the request
    run_queued()
    assert Execution.objects.get(pk="adm-run").status == "completed"
    with pytest.raises(fx.Crash):
        fx.CRASH_PASSES = False
        start("test.crashing", {}, execution_id="adm-cx")
    response = admin_client.post("/admin/journal/execution/", {"action": "cancel_executions",
                                                               "_selected_action": ["adm-cx"], "post": "yes"})
    assert response.status_code == 302
    assert Execution.objects.get(pk="adm-cx").status == "cancelled"
    assert Event.objects.read("adm-cx")[-1].type == "EXECUTION_CANCELLED"
