"""Issue 27, as an operator reads a failing Django task in the admin (headless Chromium, no JavaScript): the
executions list names the task (not loom.task), its flow filter offers the task's name and clicking it keeps the
task's executions; the execution page shows each of the three attempts as a failed attempt with its error, and
clicking "traceback" shows a readable traceback (lines, not one JSON-escaped string)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from queues.tasks import LoomBackend
from tests.admin.test_browser import CHROMIUM, browser_page, click_through  # noqa: F401  (the fixture)
from tests.fixtures import queue_flows
from tests.queues.test_tasks_backend import work

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium "
                                                     "(install it with scripts/ensure-chromium)"),
]


@pytest.mark.django_db(transaction=True)
def test_an_operator_finds_a_failing_task_by_name_and_reads_each_attempts_traceback(live_server, browser_page):  # noqa: F811
    backend = LoomBackend("default", {"QUEUES": ["default"], "OPTIONS": {"ATTEMPTS": 3}})
    failed = backend.enqueue(queue_flows.explode, ["disk full"], {})
    other = queue_flows.add.enqueue(1, 2)
    assert sorted(work()) == ["completed", "failed"]
    from leases.keeper import get_keeper, reset_keeper

    get_keeper().shutdown()
    reset_keeper(None)
    User.objects.create_superuser("op", "op@example.com", "pw-for-the-browser")

    page = browser_page
    page.goto(f"{live_server.url}/admin/login/?next=/admin/journal/execution/")
    page.fill("#id_username", "op")
    page.fill("#id_password", "pw-for-the-browser")
    click_through(page.locator("input[type=submit]"))
    page.wait_for_url("**/admin/journal/execution/")
    rows = page.locator("#result_list tbody tr")
    assert "tests.fixtures.queue_flows.explode" in rows.filter(has_text=failed.id).inner_text()
    assert "tests.fixtures.queue_flows.add" in rows.filter(has_text=other.id).inner_text()

    click_through(page.locator("#changelist-filter a", has_text="tests.fixtures.queue_flows.explode"))
    page.wait_for_url("**flow=tests.fixtures.queue_flows.explode**")
    listed = page.locator("#result_list tbody").inner_text()
    assert failed.id in listed and other.id not in listed

    click_through(page.locator("#result_list tbody a", has_text=failed.id))
    page.wait_for_url(f"**/{failed.id}/change/**")
    attempts = page.locator("#loom-timeline tbody tr")
    assert attempts.count() == 3
    for n in range(3):
        cells = attempts.nth(n).locator("td")
        assert cells.nth(1).inner_text() == "call" and cells.nth(2).inner_text() == str(n + 1)
        assert cells.nth(3).inner_text() == ("failed" if n == 2 else "retrying")
        assert "builtins.ValueError: disk full" in cells.nth(5).inner_text()
    page.locator(".loom-traceback summary").first.click()
    shown = page.locator(".loom-traceback pre").first
    assert shown.is_visible()
    lines = shown.inner_text().splitlines()
    assert lines[0] == "Traceback (most recent call last):" and lines[-1] == "ValueError: disk full"
    assert "builtins.ValueError: disk full (after 3 attempts)" in page.content()
