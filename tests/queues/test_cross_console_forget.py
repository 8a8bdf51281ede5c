"""Across the console, queues and forget (issues 24, 28, privacy): in headless Chromium an operator pauses a
queue on the operations page, a start with a marked field waits in it, the operator cancels that start from its
execution page and then forgets its subject from the data subjects page. Afterwards nothing holds the marked
value: not the queue row, not the execution header, not the admin's search (journal/search.py), not any byte
of the database; resuming the queue runs nothing."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from journal.flows import ownership as own
from journal.models import DataKey, Event, Execution
from journal.privacy import keys
from journal.search import search
from queues import declare_queue, enqueue, run_due
from queues.declarations import forget as forget_queue
from queues.models import Queue, QueueEntry
from tests.admin.test_browser import CHROMIUM, browser_page, click_through  # noqa: F401  (the fixture)
from tests.fixtures import privacy_fixtures as fx
from tests.queues.test_queued_executions import database_bytes

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium "
                                                     "(install it with scripts/ensure-chromium)"),
]

SECRET = "cross-console-9931@example.org"


@pytest.mark.django_db(transaction=True)  # committed rows: the live server and pg_dump see them
def test_a_queued_start_of_a_paused_queue_cancelled_in_the_console_then_forgotten_leaves_no_personal_data(
        live_server, browser_page, settings, tmp_path):  # noqa: F811
    settings.LOOM_KEYS = [fx.KEY_A]
    settings.LOOM_CONTENT_DIR = str(tmp_path / "content")
    keys.cache.clear()
    installed = own.get_ownership()
    own.set_ownership(None)  # no lease keeper in this process: run_due runs in the test's thread
    declare_queue("xc-mail", concurrency=2)
    User.objects.create_superuser("op", "op@example.com", "pw-for-the-browser")
    try:
        enqueue("test.privacy.signup", {"customer_id": "c-other", "email": "other@example.org"}, queue="xc-mail",
                execution_id="xc-other")
        assert run_due() == ["completed"]  # the queue's row exists and dispatches

        page = browser_page
        page.goto(f"{live_server.url}/admin/login/?next=/admin/queues/queue/operations/")
        page.fill("#id_username", "op")
        page.fill("#id_password", "pw-for-the-browser")
        click_through(page.locator("input[type=submit]"))
        page.wait_for_url("**/admin/queues/queue/operations/")
        click_through(page.locator("#loom-ops-queues tr[data-queue=xc-mail] button.loom-pause-queue"))
        assert Queue.objects.get(pk="xc-mail").paused_at is not None

        enqueue("test.privacy.signup", {"customer_id": "c-xc", "email": SECRET}, queue="xc-mail",
                execution_id="xc-queued")
        assert run_due() == []  # paused: it waits
        assert Execution.objects.get(pk="xc-queued").status == "queued"
        assert list(search(Execution.objects.all(), SECRET)) == []  # a marked value is never searchable

        page.goto(f"{live_server.url}/admin/journal/execution/xc-queued/change/")
        click_through(page.locator("#loom-cancel-button"))
        page.wait_for_url("**/admin/journal/execution/xc-queued/cancel/")
        click_through(page.locator("#loom-confirm"))
        page.wait_for_url("**/admin/journal/execution/xc-queued/change/")
        assert Execution.objects.get(pk="xc-queued").status == "cancelled"
        assert QueueEntry.objects.get(execution_id="xc-queued").state == "cancelled"

        page.goto(f"{live_server.url}/admin/journal/datakey/?q=c-xc")
        page.locator("tr", has_text="c-xc").locator("input.action-select").check()
        page.select_option("select[name=action]", "forget_subjects")
        click_through(page.locator("button[name=index]"))
        click_through(page.locator("#loom-confirm"))
        page.wait_for_url("**/admin/journal/datakey/**")
        assert "forgotten: c-xc" in page.locator("ul.messagelist").inner_text().lower()
        assert DataKey.objects.get(pk="c-xc").wrapped is None

        entry = QueueEntry.objects.get(execution_id="xc-queued")
        header = Execution.objects.get(pk="xc-queued")
        assert SECRET not in entry.input + entry.meta
        assert SECRET not in f"{header.input} {header.result} {header.error}"
        assert list(search(Execution.objects.all(), SECRET)) == []
        page.goto(f"{live_server.url}/admin/journal/execution/?q={SECRET}")
        assert "0 results" in page.locator("#changelist").inner_text()  # (the search box echoes the term)
        page.goto(f"{live_server.url}/admin/journal/execution/xc-queued/change/")
        assert SECRET not in page.content()
        assert SECRET not in database_bytes()  # no row of any table, no log entry, holds it
        assert SECRET not in str([e.payload for e in Event.objects.read("xc-queued")])

        page.goto(f"{live_server.url}/admin/queues/queue/operations/")
        click_through(page.locator("#loom-ops-queues tr[data-queue=xc-mail] button.loom-resume-queue"))
        assert Queue.objects.get(pk="xc-mail").paused_at is None
        assert run_due() == []  # the cancelled start never runs
        assert Execution.objects.get(pk="xc-queued").status == "cancelled"
    finally:
        own.set_ownership(installed)
        forget_queue("xc-mail")
        keys.cache.clear()
