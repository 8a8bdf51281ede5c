"""The execution admin for flows that wait: what a waiting execution waits for, and the verbs "wake now",
"send message", "suspend"/"resume" and "fork", each under its own permission, with its confirmation.

The test client checks permissions, plans and what each verb writes (woken in this process with
`wake_due`, as a worker's waker would); the buttons are clicked in headless Chromium against a real
`loom_worker` at the end of the file (marker `browser`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from django.contrib.auth.models import Permission, User

from journal.flows import ownership as own
from journal.flows import start
from journal.models import Event, Execution
from queues.models import QueueEntry
from tests.admin.test_browser import CHROMIUM, browser_page, click_through  # noqa: F401  (the fixture)
from tests.conftest import ROOT
from tests.fixtures import edge_waits_flows as wf
from tests.fixtures.lease_flows import run_handed_over_here

PAGE = "/admin/journal/execution/{}/change/"


@pytest.fixture(autouse=True)
def _settings(settings):
    settings.LOOM_FLOW_MODULES = ["tests.fixtures.edge_waits_flows"]
    settings.LOOM_WAIT_INLINE_MAX = 0.0  # every wait parks
    installed = own.get_ownership()
    own.set_ownership(None)
    yield
    own.set_ownership(installed)


@pytest.fixture
def effects(transactional_db):
    wf.create_effects_table()


def wake_all() -> None:
    from journal.flows import wake_due

    for _ in range(20):
        if not wake_due():
            return


def run_queued() -> None:
    """Run every due queue entry here, as a worker's dispatcher would (issue #24: hand-overs are resume
    entries on the queue, no longer django-q2 tasks)."""
    run_handed_over_here()


def types(execution_id: str) -> list[str]:
    return [e.type for e in Event.objects.read(execution_id)]


def staff(client, *perms: str) -> User:
    user = User.objects.create_user("op", password="pw", is_staff=True)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename, content_type__app_label="journal"))
    client.force_login(user)
    return user


pytestmark = pytest.mark.django_db(transaction=True)


# -- what a waiting execution waits for -----------------------------------------------------------------
def test_the_page_of_a_waiting_execution_says_what_it_waits_for(admin_client, effects):
    assert start("edge.sleeper", {"seconds": 3600}, execution_id="ad-sleep").status == "waiting"
    assert start("edge.receiver", {"topic": "orders"}, execution_id="ad-recv").status == "waiting"
    assert start("edge.parent", {"ns": [1]}, execution_id="ad-parent").status == "waiting"
    page = admin_client.get(PAGE.format("ad-sleep")).content.decode()
    assert "a timer, due at" in page and 'id="loom-due"' in page and "UTC" in page
    page = admin_client.get(PAGE.format("ad-recv")).content.decode()
    assert 'a message on topic <code id="loom-topic">orders</code>' in page
    page = admin_client.get(PAGE.format("ad-parent")).content.decode()
    child = Execution.objects.get(flow="edge.child").pk
    assert "child execution" in page and child in page
    # the list filters by the new statuses
    listing = admin_client.get("/admin/journal/execution/?status__exact=waiting").content.decode()
    assert "ad-sleep" in listing and "status__exact=suspended" in listing


def test_messages_not_yet_received_are_listed(admin_client, effects):
    from journal.flows import send

    start("edge.receiver", {"topic": "orders"}, execution_id="ad-pending")
    send("ad-pending", "other-topic", {"sku": 12}, message_id="pm-1")
    page = admin_client.get(PAGE.format("ad-pending")).content.decode()
    assert 'id="loom-messages"' in page and "pm-1" in page and "other-topic" in page


# -- permissions --------------------------------------------------------------------------------------------
def test_view_permission_shows_no_wait_buttons_and_every_verb_is_refused(client, effects):
    start("edge.sleeper", {"seconds": 3600}, execution_id="ad-view")
    staff(client, "view_execution")
    page = client.get(PAGE.format("ad-view")).content.decode()
    assert "a timer, due at" in page
    for button in ("loom-wake-button", "loom-message-button", "loom-suspend-button", "loom-fork-button"):
        assert button not in page
    before = types("ad-view")
    client.post("/admin/journal/execution/ad-view/wake/")
    client.post("/admin/journal/execution/ad-view/suspend/", {"confirm": "yes"})
    client.post("/admin/journal/execution/ad-view/message/", {"confirm": "yes", "topic": "t", "payload": "1"})
    client.post("/admin/journal/execution/ad-view/fork/", {"confirm": "yes", "from_step": "0"})
    client.post("/admin/journal/execution/", {"action": "wake_executions", "_selected_action": ["ad-view"],
                                              "post": "yes"})
    assert types("ad-view") == before and Execution.objects.count() == 1
    assert Execution.objects.get(pk="ad-view").status == "waiting"


@pytest.mark.parametrize("verb, codename", [("wake", "wake_execution"), ("suspend", "suspend_execution"),
                                            ("message", "message_execution"), ("fork", "fork_execution")])
def test_each_wait_verb_needs_its_own_permission(client, effects, verb, codename):
    start("edge.sleeper", {"seconds": 3600}, execution_id="ad-perm")
    staff(client, "view_execution", codename)
    page = client.get(PAGE.format("ad-perm")).content.decode()
    shown = {v for v in ("wake", "suspend", "message", "fork") if f"loom-{v}-button" in page}
    assert shown == {verb}


# -- the verbs ---------------------------------------------------------------------------------------------
def test_wake_now_ends_a_sleep_early_and_a_waker_finishes_the_flow(admin_client, effects):
    start("edge.sleeper", {"seconds": 3600}, execution_id="ad-wake")
    wake_all()
    assert Execution.objects.get(pk="ad-wake").status == "waiting"  # not due for an hour
    admin_client.post("/admin/journal/execution/ad-wake/wake/")
    wake_all()
    assert Execution.objects.get(pk="ad-wake").status == "completed"
    assert "WAIT_WOKEN" in types("ad-wake")
    assert wf.effects("ad-wake") == [("ad-wake", "before"), ("ad-wake", "after")]


def test_the_message_form_refuses_bad_json_and_sends_good_json_once(admin_client, effects):
    from journal.models import Message

    start("edge.receiver", {"topic": "orders"}, execution_id="ad-msg")
    form = admin_client.get("/admin/journal/execution/ad-msg/message/").content.decode()
    assert 'id="loom-payload"' in form and 'id="loom-topic"' in form
    bad = admin_client.post("/admin/journal/execution/ad-msg/message/",
                            {"confirm": "yes", "topic": "orders", "payload": "{not json"})
    assert bad.status_code == 200 and b"the payload is not JSON" in bad.content
    nan = admin_client.post("/admin/journal/execution/ad-msg/message/",
                            {"confirm": "yes", "topic": "orders", "payload": "NaN"})
    assert b"the payload is not JSON" in nan.content
    assert Message.objects.count() == 0
    for _ in range(2):  # the same message id twice: sent once
        admin_client.post("/admin/journal/execution/ad-msg/message/",
                          {"confirm": "yes", "topic": "orders", "payload": '{"sku": 7}', "message_id": "form-1"})
    assert Message.objects.filter(execution_id="ad-msg").count() == 1
    wake_all()
    assert Execution.objects.get(pk="ad-msg").result == {"sku": 7}


def test_suspend_asks_first_then_resume_hands_the_run_to_a_worker(admin_client, effects):
    start("edge.receiver", {"topic": "orders"}, execution_id="ad-susp")
    confirm = admin_client.get("/admin/journal/execution/ad-susp/suspend/")
    assert b"will be suspended" in confirm.content
    assert Execution.objects.get(pk="ad-susp").status == "waiting"
    admin_client.post("/admin/journal/execution/ad-susp/suspend/", {"confirm": "yes"})
    assert Execution.objects.get(pk="ad-susp").status == "suspended"
    assert "EXECUTION_SUSPENDED" in types("ad-susp")
    page = admin_client.get(PAGE.format("ad-susp")).content.decode()
    assert "loom-resume-button" in page and "loom-suspend-button" not in page
    admin_client.post("/admin/journal/execution/ad-susp/resume/")
    assert QueueEntry.objects.filter(execution_id="ad-susp", state="pending").count() == 1  # handed to a worker
    run_queued()
    assert Execution.objects.get(pk="ad-susp").status == "waiting"  # it waits for its message again


def test_fork_reuses_the_steps_before_the_chosen_one(admin_client, effects):
    assert start("edge.steps", {"n": 3}, execution_id="ad-fork").status == "completed"
    bad = admin_client.post("/admin/journal/execution/ad-fork/fork/", {"confirm": "yes", "from_step": "x"})
    assert b"from step must be a step position" in bad.content and Execution.objects.count() == 1
    admin_client.post("/admin/journal/execution/ad-fork/fork/",
                      {"confirm": "yes", "from_step": "2", "new_id": "ad-fork-2"})
    wake_all()
    forked = Execution.objects.get(pk="ad-fork-2")
    assert forked.status == "completed" and forked.result == ["s0", "s1", "s2"]
    assert [s for e, s in wf.effects("ad-fork")] == ["s0", "s1", "s2", "s2"]  # s0, s1 reused; s2 ran again


def test_bulk_wake_and_suspend_show_what_will_happen_first(admin_client, effects):
    start("edge.sleeper", {"seconds": 3600}, execution_id="bulk-wait")
    start("edge.steps", {"n": 1}, execution_id="bulk-done")
    page = admin_client.post("/admin/journal/execution/", {"action": "wake_executions",
                                                           "_selected_action": ["bulk-wait", "bulk-done"]})
    assert b"its wait ends now" in page.content and b"only a waiting execution can be woken" in page.content
    assert "WAIT_WOKEN" not in types("bulk-wait")
    admin_client.post("/admin/journal/execution/", {"action": "suspend_executions",
                                                    "_selected_action": ["bulk-wait", "bulk-done"], "post": "yes"})
    assert Execution.objects.get(pk="bulk-wait").status == "suspended"
    assert Execution.objects.get(pk="bulk-done").status == "completed"


# -- the buttons, clicked in a real browser, with a real worker --------------------------------------------
@pytest.fixture
def worker(child_env):
    env = {**child_env, "LOOM_FLOW_MODULES": "tests.fixtures.edge_waits_flows", "LOOM_LEASE_MODE": "off",
           "LOOM_Q_WORKERS": "1", "LOOM_WAIT_INLINE_MAX": "0", "LOOM_WAIT_POLL": "0.2"}
    proc = subprocess.Popen([sys.executable, "manage.py", "loom_worker", "--id", "waits-browser"], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        yield proc
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_until(predicate, what: str, proc: subprocess.Popen, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, f"{what}: the worker exited ({proc.returncode})"
        assert time.monotonic() < deadline, f"timed out waiting for: {what}"
        time.sleep(0.1)


def status(execution_id: str) -> str:
    return Execution.objects.get(pk=execution_id).status


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium "
                                                  "(install it with scripts/ensure-chromium)")
def test_wait_buttons_act_on_real_executions(live_server, browser_page, worker, effects):  # noqa: F811
    User.objects.create_superuser("op", "op@example.com", "pw-for-the-browser")
    start("edge.sleeper", {"seconds": 3600}, execution_id="br-wake")
    start("edge.receiver", {"topic": "orders"}, execution_id="br-msg")
    start("edge.receiver", {"topic": "orders"}, execution_id="br-susp")
    start("edge.steps", {"n": 2}, execution_id="br-fork")
    page = browser_page
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.fill("#id_username", "op")
    page.fill("#id_password", "pw-for-the-browser")
    click_through(page.locator("input[type=submit]"))
    page.wait_for_url("**/admin/")

    # Wake now: the worker's waker finishes the sleep an hour early.
    page.goto(f"{live_server.url}{PAGE.format('br-wake')}")
    assert "a timer, due at" in page.locator("#loom-waiting").inner_text()
    click_through(page.locator("#loom-wake-button"))
    page.wait_for_url(f"**{PAGE.format('br-wake')}")
    assert "its wait ends now" in page.locator("ul.messagelist").inner_text()
    wait_until(lambda: status("br-wake") == "completed", "the woken sleep completes", worker)

    # Send message: a form; the waiting flow receives it on the worker.
    page.goto(f"{live_server.url}{PAGE.format('br-msg')}")
    click_through(page.locator("#loom-message-button"))
    page.wait_for_url("**/br-msg/message/")
    page.fill("#loom-topic", "orders")
    page.fill("#loom-payload", '{"sku": 42}')
    click_through(page.locator("#loom-confirm"))
    page.wait_for_url(f"**{PAGE.format('br-msg')}")
    wait_until(lambda: status("br-msg") == "completed", "the message is received", worker)
    assert Execution.objects.get(pk="br-msg").result == {"sku": 42}

    # Suspend (confirmed), then Resume: handed to the worker, which parks it on its recv again.
    page.goto(f"{live_server.url}{PAGE.format('br-susp')}")
    click_through(page.locator("#loom-suspend-button"))
    page.wait_for_url("**/br-susp/suspend/")
    assert "will be suspended" in page.locator("#loom-plan").inner_text()
    assert status("br-susp") == "waiting"
    click_through(page.locator("#loom-confirm"))
    page.wait_for_url(f"**{PAGE.format('br-susp')}")
    assert status("br-susp") == "suspended"
    click_through(page.locator("#loom-resume-button"))
    page.wait_for_url(f"**{PAGE.format('br-susp')}")
    wait_until(lambda: "EXECUTION_RESUMED" in types("br-susp") and status("br-susp") == "waiting",
               "the resumed run waits again", worker)

    # Fork from step 1: a new execution reusing s0, run by the worker.
    page.goto(f"{live_server.url}{PAGE.format('br-fork')}")
    click_through(page.locator("#loom-fork-button"))
    page.wait_for_url("**/br-fork/fork/")
    page.fill("#loom-from-step", "1")
    page.fill("#loom-new-id", "br-fork-2")
    click_through(page.locator("#loom-confirm"))
    page.wait_for_url(f"**{PAGE.format('br-fork')}")
    wait_until(lambda: Execution.objects.filter(pk="br-fork-2", status="completed").exists(), "the fork runs",
               worker)
    assert [s for _, s in wf.effects("br-fork")] == ["s0", "s1", "s1"]
