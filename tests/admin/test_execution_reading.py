"""Reading executions on their admin page (issue #28): a flow's own exception has its traceback, shown as
lines; parent and child are linked both ways; an ordinary resume after a wait is no "recovery"; a cancel's
reason is a reason; a parked execution's duration goes on; a Resume that would be refused is disabled with
why; date-times of the lists to the millisecond."""

from __future__ import annotations

import re
import time

import pytest
from django.utils import timezone

from journal.flows import cancel, start, wake_due
from journal.flows import ownership as own
from journal.models import Event, Execution, Fence
from leases.keeper import LeaseKeeper
from leases.ownership import LeaseOwnership
from leases.store import store_for
from tests.fixtures import admin_flows as af
from tests.fixtures import waits_flows  # noqa: F401  (waits.parent, waits.child, waits.sleeper)

pytestmark = pytest.mark.django_db(transaction=True)
PAGE = "/admin/journal/execution/{}/change/"
MILLIS = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC")


@pytest.fixture(autouse=True)
def _flows(settings, effects):
    settings.LOOM_FLOW_MODULES = ["tests.fixtures.waits_flows", "tests.fixtures.admin_flows"]
    settings.LOOM_SNAPSHOT_EVERY = None
    settings.LOOM_WAIT_INLINE_MAX = 0.0  # every wait parks
    installed = own.get_ownership()
    own.set_ownership(None)
    af.CRASH = False
    yield
    own.set_ownership(installed)


def wake_until(execution_id: str, wanted=("completed", "failed", "cancelled"), limit: float = 20.0) -> str:
    """Run the waker here until the execution settles (a bound, not a timing claim)."""
    give_up = time.monotonic() + limit
    while time.monotonic() < give_up:
        wake_due()
        status = Execution.objects.get(pk=execution_id).status
        if status in wanted:
            return status
        time.sleep(0.02)
    raise AssertionError(f"{execution_id} did not settle")


def test_a_child_and_its_parent_link_each_other_and_the_childs_exception_has_its_traceback(admin_client):
    start("waits.parent", {"n": 1, "fail": True}, execution_id="tree-1")
    child = "tree-1.child-0"
    assert wake_until(child) == "failed"
    failed = next(e for e in Event.objects.read(child) if e.type == "EXECUTION_FAILED").payload
    assert "RuntimeError: child failed on purpose" in failed["traceback"]
    assert 'raise RuntimeError("child failed on purpose")' in failed["traceback"]  # the source line
    parent_page = admin_client.get(PAGE.format("tree-1")).content.decode()
    assert f'<a class="loom-child" href="{PAGE.format(child)}">{child}</a>' in parent_page
    child_page = admin_client.get(PAGE.format(child)).content.decode()
    assert f'<a id="loom-parent" href="{PAGE.format("tree-1")}">tree-1</a>' in child_page
    shown = re.search(r'<pre id="loom-traceback">(.*?)</pre>', child_page, re.S).group(1)
    assert "Traceback (most recent call last):\n" in shown  # lines, not one escaped JSON string
    assert "\\n" not in shown


def test_a_resume_after_a_wait_is_not_labelled_a_recovery(admin_client, settings):
    start("waits.sleeper", {"seconds": 0.01}, execution_id="slept-1")
    assert wake_until("slept-1") == "completed"
    page = admin_client.get(PAGE.format("slept-1")).content.decode()
    assert "(after its wait)" in page and "after a recovery" not in page
    assert Execution.objects.get(pk="slept-1").recoveries == 0


def test_a_parked_execution_runs_on_in_the_list_and_a_cancel_reason_is_no_error(admin_client):
    start("waits.sleeper", {"seconds": 3600}, execution_id="parked-1")
    Execution.objects.filter(pk="parked-1").update(created_at=timezone.now() - timezone.timedelta(minutes=3))
    listing = admin_client.get("/admin/journal/execution/").content.decode()
    assert re.search(r"3 min [\d.]+ s \(waiting, so far\)", listing)  # not the seconds until it parked
    cancel("parked-1", "no longer needed")
    page = admin_client.get(PAGE.format("parked-1")).content.decode()
    assert "cancel reason: no longer needed" in page and "Error (or cancel reason)" in page


def test_resume_of_a_live_run_is_disabled_with_the_reason_beside_it(admin_client, settings):
    settings.LOOM_LEASE_TTL = 30.0
    own.set_ownership(LeaseOwnership("lazy", LeaseKeeper("admin-web", autostart=False)))
    af.CRASH = True
    with pytest.raises(af.Crash):
        start("admin.crash_once", {}, execution_id="live-1")
    af.CRASH = False
    assert store_for().acquire_many("worker-b", [("live-1", Fence.objects.current("live-1"))], 30.0) == {"live-1"}
    page = admin_client.get(PAGE.format("live-1")).content.decode()
    assert re.search(r'<button type="button" class="button" id="loom-resume-button" disabled', page)
    assert "refused: running under worker worker-b" in page
    assert "loom-force-button" in page  # forcing stays offered, behind its confirmation
    # Buttons and permissions: a viewer without journal.resume_execution gets no Resume, enabled or not
    from django.contrib.auth.models import Permission, User
    from django.test import Client

    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_execution"))
    client = Client()
    client.force_login(viewer)
    seen = client.get(PAGE.format("live-1")).content.decode()
    assert "Status (from the log)" in seen and "loom-resume-button" not in seen and "loom-resume-why" not in seen


def test_the_lists_show_times_to_the_millisecond(admin_client):
    start("waits.sleeper", {"seconds": 3600}, execution_id="ms-1")
    assert store_for().acquire_many("ms-node", [("ms-1", Fence.objects.current("ms-1"))], 30.0) == {"ms-1"}
    for url in ("/admin/leases/lease/", "/admin/journal/execution/", "/admin/journal/event/"):
        page = admin_client.get(url).content.decode()
        assert MILLIS.search(page), url


def test_running_for_counts_from_the_retry_not_from_the_first_creation(admin_client):
    from journal.flows.runtime import retry

    af.FAIL = True
    try:
        assert start("admin.fail_second", {}, execution_id="rf-1").status == "failed"
    finally:
        af.FAIL = False
    Execution.objects.filter(pk="rf-1").update(created_at=timezone.now() - timezone.timedelta(hours=1))
    retry("rf-1", actor="test", handoff=True)  # handed to a worker that is not running here: running
    page = admin_client.get(PAGE.format("rf-1")).content.decode()
    seconds = float(re.search(r"running for ([\d.]+) s \(since its retry\)", page).group(1))
    assert seconds < 3600  # not the hour since it was first created
