"""The queue and schedule admin in a real browser (headless Chromium, no JavaScript) with a real
`loom_worker`: a schedule created by clicking fires and its execution completes; the queue page shows
running, cap and depth; the executions list filters by queue and by schedule; bulk cancel and bulk
resume act only after their confirmation page."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from django.contrib.auth.models import User

from journal.flows import flow, start
from journal.flows import ownership as own
from journal.models import Execution
from tests.admin.test_browser import CHROMIUM, browser_page, click_through  # noqa: F401  (the fixture)
from tests.admin.test_browser_admin import wait_until
from tests.conftest import ROOT
from tests.fixtures import admin_flows as af
from tests.fixtures import schedule_flows  # noqa: F401

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium "
                                                     "(install it with scripts/ensure-chromium)"),
]


@pytest.fixture
def worker(child_env):
    """`manage.py loom_worker` with its django-q2 cluster: it runs the admin's and the schedules' flows
    (not qadmin.only_here: the queue's entries of it stay pending), ticks schedules every 0.2 s, leases off."""
    env = {**child_env, "LOOM_FLOW_MODULES": "tests.fixtures.admin_flows,tests.fixtures.schedule_flows",
           "LOOM_LEASE_MODE": "off", "LOOM_Q_WORKERS": "1", "LOOM_SCHEDULE_EVERY": "0.2"}
    proc = subprocess.Popen([sys.executable, "manage.py", "loom_worker", "--id", "queue-admin-worker"], env=env,
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()


@flow("qadmin.only_here")
def only_here(ctx, value):
    """Registered in the test process only: a worker never claims its queue entries."""
    return value


def crashed(execution_id: str) -> None:
    af.CRASH = True
    try:
        with pytest.raises(af.Crash):
            start("admin.crash_once", {}, execution_id=execution_id)
    finally:
        af.CRASH = False


@pytest.mark.django_db(transaction=True)
def test_schedule_created_by_clicking_fires_and_queue_and_bulk_pages_work(live_server, browser_page, settings,  # noqa: F811
                                                                         worker):
    from queues import declare_queue, enqueue
    from queues.declarations import forget

    settings.LOOM_FLOW_MODULES = ["tests.fixtures.admin_flows", "tests.fixtures.schedule_flows"]
    settings.LOOM_LEASE_TTL, settings.LOOM_LEASE_LAZY_GRACE = 1.0, 0.2
    User.objects.create_superuser("op", "op@example.com", "pw-for-the-browser")
    installed = own.get_ownership()
    own.set_ownership(None)  # no lease keeper in this process
    try:
        for eid in ("bulk-cancel-1", "bulk-cancel-2", "bulk-resume"):
            crashed(eid)
        # Entries of a flow the worker does not have: they stay pending.
        declare_queue("mail", concurrency=4)
        for i in range(3):
            enqueue("qadmin.only_here", {"i": i}, queue="mail", execution_id=f"mail-{i}")
    finally:
        own.set_ownership(installed)

    page = browser_page
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.fill("#id_username", "op")
    page.fill("#id_password", "pw-for-the-browser")
    click_through(page.locator("input[type=submit]"))
    page.wait_for_url("**/admin/")

    # A malformed cron is refused on the form, nothing written.
    page.goto(f"{live_server.url}/admin/leases/schedule/add/")
    page.fill("#id_name", "clicked")
    page.fill("#id_cron", "61 * * * *")
    page.fill("#id_flow", "sched.echo")
    page.fill("#id_input", '{"x": 1}')
    click_through(page.locator("input[name=_save]"))
    assert "InvalidSchedule" in page.locator(".errornote, .errorlist").first.inner_text() + page.content()
    from leases.models import Schedule

    assert not Schedule.objects.exists()

    # An unknown time zone is refused on the form too, nothing written.
    page.fill("#id_cron", "* * * * * *")
    page.fill("#id_timezone", "Europe/Atlantis")
    click_through(page.locator("input[name=_save]"))
    assert "InvalidSchedule" in page.content() and "Europe/Atlantis" in page.content()
    assert not Schedule.objects.exists()

    # The schedule, every second in Paris time, made by clicking: the worker fires it.
    page.fill("#id_timezone", "Europe/Paris")
    page.select_option("#id_catch_up", "once")
    click_through(page.locator("input[name=_save]"))
    page.wait_for_url("**/admin/leases/schedule/")
    assert "clicked" in page.locator("#result_list").inner_text()
    wait_until(lambda: Execution.objects.filter(id__startswith="sched:clicked:", status="completed").exists(),
               "the clicked schedule fires", worker)
    done = Execution.objects.filter(id__startswith="sched:clicked:", status="completed").first()
    assert done.input == {"x": 1} and done.result == {"x": 1}
    page.goto(f"{live_server.url}/admin/leases/schedule/")
    row = page.locator("#result_list tbody tr").first.inner_text()
    assert "once" in row and "UTC" in row and "sched:clicked:" in row  # next tick, last tick, last execution
    assert "Europe/Paris" in row  # its zone, and its next tick in Paris time

    # The executions list filtered by schedule, by clicking the filter.
    page.goto(f"{live_server.url}/admin/journal/execution/")
    click_through(page.locator("#changelist-filter a", has_text="clicked"))
    ids = page.locator("#result_list tbody th").all_inner_texts()
    assert ids and all(i.startswith("sched:clicked:") for i in ids)

    # The queue page: running 0 of cap 4, depth 3; its link lists the queue's executions.
    page.goto(f"{live_server.url}/admin/queues/queue/")
    cells = page.locator("#result_list tbody tr", has_text="mail").first.locator("td, th").all_inner_texts()
    # the action checkbox (pause/resume), name, dispatch, running, cap, depth, ready
    assert cells[:7] == ["", "mail", "running", "0", "4", "3", "3"]
    click_through(page.locator("#result_list a", has_text="executions of mail"))
    assert "queue=mail" in page.url

    # Bulk cancel: a confirmation page first, nothing cancelled until "Yes".
    page.goto(f"{live_server.url}/admin/journal/execution/?status__exact=running")
    for eid in ("bulk-cancel-1", "bulk-cancel-2"):
        page.locator(f"input[name=_selected_action][value='{eid}']").check()
    page.select_option("select[name=action]", "cancel_executions")
    click_through(page.locator("button[name=index]"))
    assert "will be cancelled" in page.locator("#loom-plan").inner_text()
    assert Execution.objects.filter(pk__in=["bulk-cancel-1", "bulk-cancel-2"], status="running").count() == 2
    click_through(page.locator("#loom-confirm"))
    page.wait_for_url("**/admin/journal/execution/?status__exact=running")
    assert set(Execution.objects.filter(pk__startswith="bulk-cancel").values_list("status", flat=True)) == {
        "cancelled"}

    # Bulk resume: confirmed, then handed to the worker, which finishes the run.
    page.goto(f"{live_server.url}/admin/journal/execution/?status__exact=running")
    page.locator("input[name=_selected_action][value='bulk-resume']").check()
    page.select_option("select[name=action]", "resume_executions")
    click_through(page.locator("button[name=index]"))
    assert "handed to a worker" in page.locator("#loom-plan").inner_text()
    click_through(page.locator("#loom-confirm"))
    page.wait_for_url("**/admin/journal/execution/?status__exact=running")
    wait_until(lambda: Execution.objects.get(pk="bulk-resume").status == "completed", "the resume runs", worker)

    # django-q2's own pages are still there.
    page.goto(f"{live_server.url}/admin/django_q/")
    assert "Scheduled tasks" in page.content() or "Schedules" in page.content()
    forget("mail")
