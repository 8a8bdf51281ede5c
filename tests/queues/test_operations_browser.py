"""The operations page in headless Chromium (no JavaScript): its charts and tables, and every action by clicking
its button: pause and resume a queue, drain a worker, a schedule's pause, run now (on a paused queue: it waits)
and backfill twice (the second adds nothing). With LOOM_SCREENSHOTS=<dir> the page is saved there as PNG
(docs/results.md "Screenshots")."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from journal.flows import ownership as own
from journal.flows import start
from leases import schedules as sc
from leases.models import DrainRequest, Schedule, Worker
from queues import declare_queue, enqueue, run_due
from queues.declarations import forget
from queues.models import Queue, QueueEntry
from tests.admin.test_browser import CHROMIUM, browser_page, click_through  # noqa: F401  (the fixture)
from tests.fixtures import schedule_flows  # noqa: F401  (the flows)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium "
                                                     "(install it with scripts/ensure-chromium)"),
]


def shot(page, name: str) -> None:
    folder = os.environ.get("LOOM_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.set_viewport_size({"width": 1280, "height": 900})
        page.screenshot(path=str(Path(folder) / name), full_page=True)


@pytest.mark.django_db(transaction=True)
def test_every_operations_button_does_what_it_says(live_server, browser_page, settings):  # noqa: F811
    settings.LOOM_FLOW_MODULES = ["tests.fixtures.schedule_flows"]
    User.objects.create_superuser("op", "op@example.com", "pw-for-the-browser")
    installed = own.get_ownership()
    own.set_ownership(None)  # no lease keeper in this process
    declare_queue("ops-mail", concurrency=2)
    try:
        for n in range(6):  # some history for the charts: completed and failed executions, a queue's entries
            enqueue("sched.echo", {"n": n}, queue="ops-mail", execution_id=f"ops-done-{n}")
        assert run_due() == ["completed"] * 6
        for n in range(2):
            start("sched.fail", {}, execution_id=f"ops-failed-{n}")
        for n in range(3):
            enqueue("sched.echo", {"n": n}, queue="ops-mail", execution_id=f"ops-wait-{n}")
        Worker.objects.create(id="ops-worker-1", host="host-a", pid=4242, role="main")
        sc.define("ops-hourly", "0 * * * *", "sched.echo", {"n": 1}, queue="ops-mail")

        page = browser_page
        page.goto(f"{live_server.url}/admin/login/?next=/admin/queues/queue/operations/")
        page.fill("#id_username", "op")
        page.fill("#id_password", "pw-for-the-browser")
        click_through(page.locator("input[type=submit]"))
        page.wait_for_url("**/admin/queues/queue/operations/")
        assert page.locator("#loom-charts svg").count() == 3
        row = page.locator("#loom-ops-queues tr[data-queue=ops-mail]")
        assert row.locator(".dispatch").inner_text() == "running" and "3" in row.inner_text()

        click_through(row.locator("button.loom-pause-queue"))
        row = page.locator("#loom-ops-queues tr[data-queue=ops-mail]")
        assert row.locator(".dispatch").inner_text().startswith("paused since")
        assert "Queue ops-mail: paused" in page.locator(".messagelist").text_content()
        assert Queue.objects.get(pk="ops-mail").paused_by == "op (admin)"
        assert run_due() == []  # nothing is dispatched from it

        sched = page.locator("#loom-ops-schedules tr[data-schedule=ops-hourly]")
        click_through(sched.locator("button.loom-pause-schedule"))
        sched = page.locator("#loom-ops-schedules tr[data-schedule=ops-hourly]")
        assert sched.locator(".state").inner_text() == "paused by op (admin)"
        assert Schedule.objects.get(pk="ops-hourly").paused_at is not None
        click_through(sched.locator("button.loom-run-now"))
        run_now = QueueEntry.objects.get(execution_id__startswith="sched:ops-hourly:run:")
        assert run_now.state == "pending"  # run now on a paused queue: queued, waits for the resume
        for attempt in ("first", "second"):
            sched = page.locator("#loom-ops-schedules tr[data-schedule=ops-hourly]")
            sched.locator("input.loom-backfill-start").fill("2026-01-01T00:00")
            sched.locator("input.loom-backfill-end").fill("2026-01-01T02:00")
            click_through(sched.locator("button.loom-backfill"))
            said = page.locator(".messagelist").text_content()
            assert ("queued 3 tick(s), 0 already" if attempt == "first" else "queued 0 tick(s), 3 already") in said
        sched = page.locator("#loom-ops-schedules tr[data-schedule=ops-hourly]")
        sched.locator("input.loom-backfill-start").fill("yesterday")
        sched.locator("input.loom-backfill-end").fill("2026-01-01T02:00")
        click_through(sched.locator("button.loom-backfill"))
        assert "nothing done: InvalidSchedule" in page.locator(".messagelist").text_content()
        assert QueueEntry.objects.filter(execution_id__startswith="sched:ops-hourly:").count() == 4

        worker = page.locator("#loom-ops-workers tr[data-worker=ops-worker-1]")
        assert "host-a / 4242" in worker.inner_text()
        click_through(worker.locator("button.loom-drain"))
        worker = page.locator("#loom-ops-workers tr[data-worker=ops-worker-1]")
        assert worker.locator(".drain").inner_text() == "asked (by op (admin))"
        assert worker.locator("button.loom-drain").count() == 0
        assert DrainRequest.objects.get(pk="ops-worker-1").requested_by == "op (admin)"
        page.goto(f"{live_server.url}/admin/queues/queue/operations/?window=day")
        shot(page, "operations-day.png")

        click_through(page.locator("#loom-ops-queues tr[data-queue=ops-mail] button.loom-resume-queue"))
        assert page.locator("#loom-ops-queues tr[data-queue=ops-mail] .dispatch").inner_text() == "running"
        assert Queue.objects.get(pk="ops-mail").paused_at is None
        assert len(run_due()) == 7  # the three waiting, the run-now and the three backfilled ticks
        page.goto(f"{live_server.url}/admin/queues/queue/operations/")
        shot(page, "operations-hour.png")
    finally:
        own.set_ownership(installed)
        forget("ops-mail")
