"""The queue page clicked in headless Chromium (issue 24): two starts queued with `queues.enqueue`; the
operator opens the queue's entries from the Queue list, reprioritises one, ticks the other and cancels it
after its confirmation page, and reads what was done; then a real `loom_worker` runs the queue: the other
start runs, the cancelled one never does (no execution, no effect). A view-only staff user sees the same
page and no action."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from django.contrib.auth.models import Permission, User

from journal.flows import ownership as own
from journal.models import Execution
from queues.models import QueueEntry
from tests.admin.test_browser import CHROMIUM, browser_page, click_through  # noqa: F401  (the fixture)
from tests.admin.test_browser_admin import wait_until
from tests.conftest import ROOT
from tests.fixtures import lease_flows

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium "
                                                     "(install it with scripts/ensure-chromium)"),
]

QUEUE = "browser-q"


@pytest.fixture
def two_queued():
    """Two starts of leases.steps (one step, recording its effect) on a queue of one slot, same priority."""
    from queues import declare_queue, enqueue
    from queues.declarations import forget

    lease_flows.create_effects_table()
    installed = own.get_ownership()
    own.set_ownership(None)
    declare_queue(QUEUE, concurrency=1)
    try:
        for eid in ("bq-cancel", "bq-control"):
            enqueue("leases.steps", {"n": 1, "pause": 0}, queue=QUEUE, execution_id=eid)
        yield
    finally:
        own.set_ownership(installed)
        forget(QUEUE)


def login(page, base: str, username: str, password: str) -> None:
    page.goto(f"{base}/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    click_through(page.locator("input[type=submit]"))
    page.wait_for_url("**/admin/")


def run_action(page, eid: str, action: str) -> None:
    page.locator(f"#result_list tr:has-text('{eid}') input[name=_selected_action]").check()
    page.select_option("select[name=action]", action)
    click_through(page.locator("button[name=index]"))


def test_an_operator_cancels_a_queued_start_by_clicking_and_it_never_runs(live_server, browser_page, child_env,  # noqa: F811
                                                                          two_queued):
    User.objects.create_superuser("op", "op@example.com", "pw-for-the-browser")
    page = browser_page
    login(page, live_server.url, "op", "pw-for-the-browser")

    # From the Queue list to the queue's page: both entries pending.
    page.goto(f"{live_server.url}/admin/queues/queue/")
    click_through(page.locator("#result_list a", has_text=f"entries of {QUEUE}"))
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 2
    for eid in ("bq-cancel", "bq-control"):
        assert "pending" in page.locator("#result_list tr", has_text=eid).inner_text()

    # Reprioritise the control start below the other: a bad value is refused on the form, then -5 is set.
    run_action(page, "bq-control", "reprioritise_entries")
    page.fill("#id_priority", "500")
    page.evaluate("document.querySelector('#id_priority').removeAttribute('max')")  # the server checks too
    click_through(page.locator("#loom-confirm"))
    assert "the priority must be from -100 to 100, got 500" in page.locator("#loom-problem").inner_text()
    assert QueueEntry.objects.get(execution_id="bq-control").priority == 0
    page.fill("#id_priority", "-5")
    click_through(page.locator("#loom-confirm"))
    assert "Priority -5 set on: bq-control" in page.locator(".messagelist").inner_text()
    assert QueueEntry.objects.get(execution_id="bq-control").priority == -5
    assert "-5" in page.locator("#result_list tr", has_text="bq-control").inner_text()

    # Cancel: the plan first, nothing cancelled until "Yes"; then the message says what was done.
    run_action(page, "bq-cancel", "cancel_entries")
    assert "will be cancelled: it never starts" in page.locator("#loom-plan").inner_text()
    assert QueueEntry.objects.get(execution_id="bq-cancel").state == "pending"
    click_through(page.locator("#loom-confirm"))
    assert "Cancelled, they never start: bq-cancel" in page.locator(".messagelist").inner_text()
    assert QueueEntry.objects.get(execution_id="bq-cancel").state == "cancelled"

    # A real worker runs the queue: the control start (which would come after the other) runs; the
    # cancelled one never does.
    env = {**child_env, "LOOM_FLOW_MODULES": "tests.fixtures.lease_flows", "LOOM_LEASE_MODE": "off",
           "LOOM_QUEUE_POLL": "0.2"}
    proc = subprocess.Popen([sys.executable, "manage.py", "loom_worker", "--no-cluster", "--id", "queue-page-worker"],
                            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        wait_until(lambda: Execution.objects.filter(pk="bq-control", status="completed").exists(),
                   "the worker runs the control start", proc)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=30)
    # No execution, or (where an accepted start is an execution from the start, issue 24) a cancelled one.
    assert not Execution.objects.filter(pk="bq-cancel").exclude(status="cancelled").exists()
    assert [e for e in lease_flows.effects() if e[0].startswith("bq-")] == [("bq-control", "s000")]  # this test's
    assert QueueEntry.objects.get(execution_id="bq-cancel").state == "cancelled"


def test_a_view_only_staff_user_sees_the_queue_page_and_no_action(live_server, browser_page, two_queued):  # noqa: F811
    viewer = User.objects.create_user("viewer", password="pw-for-the-browser", is_staff=True)
    viewer.user_permissions.set(Permission.objects.filter(
        codename__in=["view_queue", "view_queueentry", "view_execution"]))
    page = browser_page
    login(page, live_server.url, "viewer", "pw-for-the-browser")
    page.goto(f"{live_server.url}/admin/queues/queueentry/?queue={QUEUE}&state=live")
    assert page.locator("#result_list tbody tr").count() == 2
    assert page.locator("select[name=action]").count() == 0
    assert page.locator("input[name=_selected_action]").count() == 0
    link = page.locator("#result_list a", has_text="bq-cancel")
    assert link.get_attribute("href") == "/admin/journal/execution/bq-cancel/change/"
