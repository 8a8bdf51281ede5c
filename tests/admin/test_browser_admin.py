"""The execution admin in a real browser (headless Chromium, no JavaScript) with a real worker: the
Resume, Retry and Cancel buttons are clicked on real executions, and the outcome is read from the
database. Resume and Retry are handed to `manage.py loom_worker` (its django-q2 cluster runs them);
Cancel asks for confirmation first.

Reproduces issue 13's dead Resume button: the resume form was rendered inside the admin's own
<form>, and the HTML parser drops a nested form, so the click submitted nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from django.contrib.auth.models import User

from journal.flows import ownership as own
from journal.flows import start
from journal.models import Event, Execution
from tests.admin.test_browser import CHROMIUM, browser_page, click_through  # noqa: F401  (the fixture)
from tests.conftest import ROOT
from tests.fixtures import admin_flows as af

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium "
                                                     "(install it with scripts/ensure-chromium)"),
]


def wait_until(predicate, what: str, proc: subprocess.Popen, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"{what}: the worker exited ({proc.returncode}):\n{out}\n{err}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for: {what}")
        time.sleep(0.1)


@pytest.fixture
def worker(child_env, settings):
    """`manage.py loom_worker` with its django-q2 cluster on the test database. Lease mode off in the
    worker: no recovery sweep may finish the executions before the buttons are clicked."""
    env = {**child_env, "LOOM_FLOW_MODULES": "tests.fixtures.admin_flows", "LOOM_LEASE_MODE": "off",
           "LOOM_Q_WORKERS": "1"}
    proc = subprocess.Popen([sys.executable, "manage.py", "loom_worker", "--id", "browser-worker"], env=env,
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # its own process group: the cluster's children too
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


@pytest.mark.django_db(transaction=True)
def test_resume_retry_and_cancel_buttons_act_on_real_executions(live_server, browser_page, worker, settings):  # noqa: F811
    # The web process's own view of liveness: a crashed fresh run counts as live for grace + TTL.
    settings.LOOM_LEASE_TTL, settings.LOOM_LEASE_LAZY_GRACE = 1.0, 0.2
    settings.LOOM_FLOW_MODULES = ["tests.fixtures.admin_flows"]
    User.objects.create_superuser("op", "op@example.com", "pw-for-the-browser")
    installed = own.get_ownership()
    own.set_ownership(None)  # no lease keeper thread in this process (it would outlive the test database)
    try:
        af.CRASH = True
        for eid in ("br-resume", "br-cancel"):
            with pytest.raises(af.Crash):
                start("admin.crash_once", {}, execution_id=eid)
        af.CRASH, af.FAIL = False, True
        assert start("admin.fail_second", {}, execution_id="br-retry").status == "failed"
    finally:
        af.CRASH, af.FAIL = False, False
        own.set_ownership(installed)  # the web pages judge liveness with the leases app's ownership
    time.sleep(1.3)  # past the lazy grace + TTL: nobody drives the crashed runs any more

    page = browser_page
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.fill("#id_username", "op")
    page.fill("#id_password", "pw-for-the-browser")
    click_through(page.locator("input[type=submit]"))
    page.wait_for_url("**/admin/")

    # Resume: handed to the worker, which finishes the run.
    page.goto(f"{live_server.url}/admin/journal/execution/br-resume/change/")
    click_through(page.locator("#loom-resume-button"))
    page.wait_for_url("**/admin/journal/execution/br-resume/change/")
    assert "handed over to a worker" in page.locator("ul.messagelist").inner_text()
    wait_until(lambda: Execution.objects.get(pk="br-resume").status == "completed", "the resume runs", worker)
    assert [e.type for e in Event.objects.read("br-resume")][-3:] == ["STEP_STARTED", "STEP_COMPLETED",
                                                                     "EXECUTION_COMPLETED"]

    # Retry: a new attempt recorded in the log, handed to the worker.
    page.goto(f"{live_server.url}/admin/journal/execution/br-retry/change/")
    click_through(page.locator("#loom-retry-button"))
    page.wait_for_url("**/admin/journal/execution/br-retry/change/")
    assert "handed over to a worker" in page.locator("ul.messagelist").inner_text()
    wait_until(lambda: Execution.objects.get(pk="br-retry").status == "completed", "the retry runs", worker)
    types = [e.type for e in Event.objects.read("br-retry")]
    assert "EXECUTION_FAILED" in types and "EXECUTION_RETRIED" in types and types[-1] == "EXECUTION_COMPLETED"

    # Cancel: a confirmation page, then the cancel is recorded.
    page.goto(f"{live_server.url}/admin/journal/execution/br-cancel/change/")
    click_through(page.locator("#loom-cancel-button"))
    page.wait_for_url("**/admin/journal/execution/br-cancel/cancel/")
    assert "will be cancelled" in page.locator("#loom-plan").inner_text()
    assert Execution.objects.get(pk="br-cancel").status == "running"
    click_through(page.locator("#loom-confirm"))
    page.wait_for_url("**/admin/journal/execution/br-cancel/change/")
    assert Execution.objects.get(pk="br-cancel").status == "cancelled"
    assert Event.objects.read("br-cancel")[-1].type == "EXECUTION_CANCELLED"
    assert "Settled" in page.locator("#loom-actions").inner_text()
