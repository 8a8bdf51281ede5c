"""A start through the HTTP API is an execution from the moment it is accepted (issue 24), clicked in headless
Chromium: the API answers 202 queued; the operator finds it in the executions list under the "Queued"
filter, opens its page, clicks Cancel and confirms; a real `loom_worker` then runs the queue: the start
that was not cancelled runs, the cancelled one never does (no effect), and its queue entry is cancelled."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request

import pytest
from django.contrib.auth.models import User

from journal.flows import ownership as own
from journal.models import Execution
from queues.models import QueueEntry
from tests.admin.test_browser import CHROMIUM, browser_page, click_through  # noqa: F401  (the fixture)
from tests.admin.test_browser_admin import wait_until
from tests.conftest import ROOT
from tests.fixtures import lease_flows
from tests.queues.test_queue_entries_browser import login

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium "
                                                     "(install it with scripts/ensure-chromium)"),
]

TOKEN = "browser-api-token-0123456789abcdef"


def api_start(base: str, execution_id: str) -> tuple[int, dict]:
    body = json.dumps({"input": {"n": 1, "pause": 0}, "execution_id": execution_id}).encode()
    request = urllib.request.Request(f"{base}/api/flows/leases.steps/executions", data=body, method="POST",
                                     headers={"Authorization": f"Bearer {TOKEN}",
                                              "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status, json.loads(response.read())


@pytest.fixture
def api_settings(settings):
    settings.LOOM_API_TOKENS = [TOKEN]
    settings.LOOM_API_AUTH = True
    lease_flows.create_effects_table()
    installed = own.get_ownership()
    own.set_ownership(None)
    yield
    own.set_ownership(installed)


def test_an_api_start_is_queued_in_the_admin_and_cancelled_there_never_runs(live_server, browser_page,  # noqa: F811
                                                                           child_env, api_settings):
    for eid in ("apiq-cancel", "apiq-control"):
        status, body = api_start(live_server.url, eid)
        assert (status, body["status"], body["execution_id"]) == (202, "queued", eid), body
    User.objects.create_superuser("op", "op@example.com", "pw-for-the-browser")
    page = browser_page
    login(page, live_server.url, "op", "pw-for-the-browser")

    # The executions list, filtered by the "Queued" status: both API starts are there before any worker ran.
    page.goto(f"{live_server.url}/admin/journal/execution/")
    click_through(page.locator("#changelist-filter a", has_text="Queued").first)
    listed = page.locator("#result_list tbody").inner_text()
    assert "apiq-cancel" in listed and "apiq-control" in listed

    # Its page: the Cancel button, the plan, "Yes", and what was done.
    click_through(page.locator("#result_list a", has_text="apiq-cancel"))
    click_through(page.locator("#loom-cancel-button"))
    assert "its queue entry never begins" in page.locator("#loom-plan").inner_text()
    assert Execution.objects.get(pk="apiq-cancel").status == "queued"  # nothing done before "Yes"
    click_through(page.locator("#loom-confirm"))
    assert "apiq-cancel: cancelled at once (it was queued: its entry never begins)" in \
        page.locator(".messagelist").inner_text()
    assert Execution.objects.get(pk="apiq-cancel").status == "cancelled"
    assert QueueEntry.objects.get(execution_id="apiq-cancel").state == "cancelled"

    # A real worker runs the default queue: the other start runs, the cancelled one never does.
    env = {**child_env, "LOOM_FLOW_MODULES": "tests.fixtures.lease_flows", "LOOM_LEASE_MODE": "off",
           "LOOM_QUEUE_POLL": "0.2"}
    proc = subprocess.Popen([sys.executable, "manage.py", "loom_worker", "--no-cluster", "--id", "api-queue-worker"],
                            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        wait_until(lambda: Execution.objects.filter(pk="apiq-control", status="completed").exists(),
                   "the worker runs the start that was not cancelled", proc)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=60)
    assert Execution.objects.get(pk="apiq-cancel").status == "cancelled"
    assert [e for e in lease_flows.effects() if e[0].startswith("apiq-")] == [("apiq-control", "s000")]
