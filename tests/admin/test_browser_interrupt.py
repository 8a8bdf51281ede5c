"""A hung step cancelled from the admin in a real browser (headless Chromium, no JavaScript) with a real
`loom_worker`: the step is blocked on a socket that never answers, so it cannot stop by itself. Cancel records
the execution cancelled at once and says what it did to the running step; the worker's watchdog tells the
step, abandons it when it ignores that (LOOM_STEP_ABANDON_AFTER) and the worker replaces itself, all within
the bound the page named (journal/flows/interrupt.py `cancel_bound`)."""

from __future__ import annotations

import json
import re
import socket
import uuid

import pytest
from django.contrib.auth.models import User

from journal.flows import events as ev
from journal.flows.interrupt import cancel_bound
from journal.models import Event, Execution
from leases.models import Lease
from queues import declare_queue, enqueue
from tests.admin.test_browser import CHROMIUM, browser_page, click_through  # noqa: F401  (the fixture)
from tests.leases.test_shutdown_processes import QUEUE, spawn, terminate
from tests.leases.test_worker_processes import cleanup, output, wait_until

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium "
                                                     "(install it with scripts/ensure-chromium)"),
]


@pytest.mark.django_db(transaction=True)
def test_cancel_in_the_admin_stops_a_step_hung_on_a_dead_socket(live_server, browser_page, child_env,  # noqa: F811
                                                                 settings, tmp_path):
    settings.LOOM_LEASE_RENEW_EVERY, settings.LOOM_STEP_ABANDON_AFTER = 0.5, 2.0  # the figures the page names
    env = {**child_env, "LOOM_LEASE_TTL": "120", "LOOM_LEASE_RENEW_EVERY": "0.5", "LOOM_LEASE_LAZY_GRACE": "0.2",
           "LOOM_RECOVERY_EVERY": "0.2", "LOOM_SHUTDOWN_GRACE": "3", "LOOM_STEP_ABANDON_AFTER": "2",
           "LOOM_FLOW_MODULES": "tests.fixtures.shutdown_flows", "LOOM_LEASE_MODE": "lazy",
           "LOOM_QUEUES": json.dumps({QUEUE: {"concurrency": 50}}), "LOOM_QUEUE_THREADS": "2",
           "LOOM_QUEUE_POLL": "0.05", "LOOM_TEST_LOGS": str(tmp_path), "PYTHONFAULTHANDLER": "1"}
    User.objects.create_superuser("op", "op@example.com", "pw-for-the-browser")
    declare_queue(QUEUE, concurrency=50)
    eid = f"hung-{uuid.uuid4().hex[:6]}"
    bound = cancel_bound()
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)  # never accepted, never answered: the step's recv blocks for ever
        enqueue("shutdown.hang", {"port": server.getsockname()[1]}, queue=QUEUE, execution_id=eid)
        proc = spawn(env, "hung-worker", "--no-cluster")
        try:
            wait_until(lambda: Lease.objects.filter(execution_id=eid, owner="hung-worker").exists(),
                       "the worker runs the hung step under its lease", timeout=60, proc=proc)
            page = browser_page
            page.goto(f"{live_server.url}/admin/login/?next=/admin/")
            page.fill("#id_username", "op")
            page.fill("#id_password", "pw-for-the-browser")
            click_through(page.locator("input[type=submit]"))
            page.wait_for_url("**/admin/")
            page.goto(f"{live_server.url}/admin/journal/execution/{eid}/change/")
            click_through(page.locator("#loom-cancel-button"))
            page.wait_for_url(f"**/admin/journal/execution/{eid}/cancel/")
            plan = page.locator("#loom-plan").inner_text()
            assert "hung-worker" in plan and f"stops within {bound:g} s" in plan, plan
            click_through(page.locator("#loom-confirm"))
            page.wait_for_url(f"**/admin/journal/execution/{eid}/change/")
            said = page.locator("ul.messagelist").inner_text()
            assert re.search(r"cancelled; the step running under worker hung-worker .* is told to stop", said), said
            assert f"stops within {bound:g} s" in said, said
            assert Execution.objects.get(pk=eid).status == "cancelled"  # recorded at once
            # Within the bound named (plus the slack of a loaded machine): told, abandoned, the worker replaced.
            wait_until(lambda: "replacing the process" in output(proc), "the worker abandons the step and retires",
                       timeout=bound + 30, proc=proc)
            wait_until(lambda: output(proc).count("running (") >= 2, "the worker is replaced", timeout=60, proc=proc)
            log = output(proc)
        finally:
            if proc.poll() is None:
                terminate(proc)
            cleanup(proc)
    assert re.search(rf"told execution={eid} step=read pos=0 to stop: cancelled", log), log
    assert f"abandoned execution={eid}" in log, log
    events = Event.objects.read(eid)
    assert events[-1].type == ev.EXECUTION_CANCELLED
    assert not [e for e in events if e.type == ev.STEP_COMPLETED]
    assert Execution.objects.get(pk=eid).status == "cancelled"
