"""The operator's console in headless Chromium (issue #28): search the executions list by a value of the
input, open the parent's child from its page and come back from the child's, and read the child's
traceback as lines. The executions are made and settled in the test process (the waker run here)."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User

from journal.flows import ownership as own
from journal.flows import start
from tests.admin.test_browser import CHROMIUM, browser_page, click_through  # noqa: F401  (the fixture)
from tests.admin.test_execution_reading import wake_until
from tests.fixtures import waits_flows  # noqa: F401  (waits.parent, waits.child)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium "
                                                     "(install it with scripts/ensure-chromium)"),
]


@pytest.mark.django_db(transaction=True)
def test_search_by_an_input_value_open_a_child_and_back_and_read_its_traceback(live_server, browser_page,  # noqa: F811
                                                                                 settings, effects):
    settings.LOOM_FLOW_MODULES = ["tests.fixtures.waits_flows"]
    settings.LOOM_WAIT_INLINE_MAX = 0.0
    User.objects.create_superuser("op", "op@example.com", "pw-for-the-browser")
    installed = own.get_ownership()
    own.set_ownership(None)  # no lease keeper thread in this process
    try:
        start("waits.parent", {"n": 1, "fail": True, "order": "ord-73519"}, execution_id="br-tree")
        start("waits.parent", {"n": 2, "order": "ord-other"}, execution_id="br-other")
        assert wake_until("br-tree.child-0") == "failed"
    finally:
        own.set_ownership(installed)

    page = browser_page
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.fill("#id_username", "op")
    page.fill("#id_password", "pw-for-the-browser")
    click_through(page.locator("input[type=submit]"))
    page.wait_for_url("**/admin/")

    page.goto(f"{live_server.url}/admin/journal/execution/")
    page.fill("#searchbar", "ord-73519")
    click_through(page.locator("#changelist-search input[type=submit]"))
    page.wait_for_url("**/admin/journal/execution/?q=ord-73519")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 1 and "br-tree" in rows.first.inner_text()

    click_through(rows.first.locator("th a"))  # the parent's page
    page.wait_for_url(re.compile(r".*/admin/journal/execution/br-tree/change/(\?.*)?$"))
    click_through(page.locator("a.loom-child"))  # its child
    page.wait_for_url(re.compile(r".*/admin/journal/execution/br-tree\.child-0/change/$"))
    traceback = page.locator("#loom-traceback").inner_text()
    assert traceback.startswith("Traceback (most recent call last):")
    assert traceback.rstrip().endswith("RuntimeError: child failed on purpose")
    assert len(traceback.splitlines()) > 3  # lines, not one escaped string
    click_through(page.locator("#loom-parent"))  # and back
    page.wait_for_url(re.compile(r".*/admin/journal/execution/br-tree/change/$"))
    assert page.locator("#loom-status").inner_text() in ("failed", "waiting")
