"""Operating executions: resume hands over to a worker and refuses a live run, retry records a new
attempt, permissions follow Django's model permissions, quoted ids, and list filters that cannot 500.

The buttons themselves are clicked in a browser in tests/admin/test_browser_admin.py; these use the test
client (permissions, confirmation pages, what is queued) and the runtime directly."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.contrib.messages import get_messages
from django.db import connection

from journal.flows import (
    ExecutionBusy,
    NotResumable,
    Outcome,
    UnknownFlow,
    describe,
    hand_over,
    resume,
    start,
)
from journal.flows import ownership as own
from journal.flows.runtime import retry
from journal.models import Event, Execution, Fence
from leases.keeper import LeaseKeeper
from leases.ownership import LeaseOwnership
from leases.store import store_for
from tests.fixtures import admin_flows as af
from tests.fixtures.lease_flows import handed_over, run_handed_over_here

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _flows(settings):
    settings.LOOM_FLOW_MODULES = ["tests.fixtures.admin_flows"]
    settings.LOOM_SNAPSHOT_EVERY = None
    af.CRASH, af.FAIL = False, False
    installed = own.get_ownership()
    own.set_ownership(None)
    yield
    own.set_ownership(installed)


@pytest.fixture
def leased(settings):
    """The leases app's ownership with a keeper driven by hand (no thread), id 'admin-web'."""
    settings.LOOM_LEASE_TTL = 30.0
    keeper = LeaseKeeper("admin-web", autostart=False)
    own.set_ownership(LeaseOwnership("lazy", keeper))
    return keeper


def queued() -> list[dict]:
    """The hand-overs waiting for a worker (issue #24: resume entries on the queue, not django-q2 tasks)."""
    return handed_over()


def run_queued() -> list:
    """Run every due queue entry here, as a worker's dispatcher would (issue #24: hand-overs are resume
    entries on the queue, no longer django-q2 tasks)."""
    return run_handed_over_here()


def crashed(execution_id: str) -> None:
    """A running execution whose run died in its second step (the first completed)."""
    af.CRASH = True
    with pytest.raises(af.Crash):
        start("admin.crash_once", {}, execution_id=execution_id)
    af.CRASH = False


def failed(execution_id: str) -> Outcome:
    """A failed execution: the first step completed, the second failed for good."""
    af.FAIL = True
    out = start("admin.fail_second", {}, execution_id=execution_id)
    af.FAIL = False
    assert out.status == "failed"
    return out


def live_lease(execution_id: str, owner: str = "worker-b", ttl: float = 30.0) -> None:
    """Another worker holds a live lease on the execution at its current fence."""
    token = Fence.objects.current(execution_id)
    assert store_for().acquire_many(owner, [(execution_id, token)], ttl) == {execution_id}


def texts(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


# -- resume -------------------------------------------------------------------------------------------
def test_resume_button_hands_the_run_to_a_worker_instead_of_running_it_in_the_request(admin_client):
    """The request only queues; the execution is still running until a worker takes the task."""
    crashed("ho-1")
    response = admin_client.post("/admin/journal/execution/ho-1/resume/", follow=True)
    assert Execution.objects.get(pk="ho-1").status == "running"
    assert Fence.objects.current("ho-1") == 1  # the web process took nothing over
    assert any("handed over to a worker" in t for t in texts(response))
    assert [t["func"] for t in queued()] == ["resume"]
    assert run_queued()[0]["status"] == "completed"
    assert Execution.objects.get(pk="ho-1").status == "completed"
    assert Fence.objects.current("ho-1") == 2


def test_resume_refuses_an_execution_with_a_live_lease_and_takes_nothing_over(admin_client, leased):
    """Reproduces the stolen healthy run: a live lease of another worker is refused (fence unchanged)."""
    crashed("busy-1")
    live_lease("busy-1")
    with pytest.raises(ExecutionBusy, match="running under worker worker-b"):
        resume("busy-1")
    with pytest.raises(ExecutionBusy):
        hand_over("busy-1")
    assert Fence.objects.current("busy-1") == 1
    response = admin_client.post("/admin/journal/execution/busy-1/resume/", follow=True)
    assert any("ExecutionBusy" in t for t in texts(response))
    assert queued() == [] and Fence.objects.current("busy-1") == 1


def test_a_forced_resume_asks_for_confirmation_then_hands_over(admin_client, leased):
    crashed("busy-2")
    live_lease("busy-2")
    page = admin_client.get("/admin/journal/execution/busy-2/change/")
    assert b"worker worker-b (lease expires in" in page.content
    assert b'href="/admin/journal/execution/busy-2/resume/?force=yes"' in page.content
    page = admin_client.get("/admin/journal/execution/busy-2/resume/", {"force": "yes"})
    assert page.status_code == 200 and b"FORCED: takes it over from worker worker-b" in page.content
    assert queued() == []
    admin_client.post("/admin/journal/execution/busy-2/resume/", {"force": "yes"})  # not confirmed
    assert queued() == []
    admin_client.post("/admin/journal/execution/busy-2/resume/", {"force": "yes", "confirm": "yes"})
    assert [t["args"] for t in queued()] == [("busy-2", 1, True)]
    assert run_queued()[0]["status"] == "completed"


def test_a_fresh_run_within_its_lazy_grace_counts_as_live(leased):
    """No lease row yet, fence token 1, header younger than grace + TTL: another process may be running it."""
    crashed("lazy-1")
    with pytest.raises(ExecutionBusy, match="within its lazy-lease grace"):
        resume("lazy-1")
    Execution.objects.filter(pk="lazy-1").update(updated_at=Execution.objects.get(pk="lazy-1").updated_at
                                                  - timedelta(seconds=60))
    assert resume("lazy-1").status == "completed"


def test_an_expired_lease_is_not_live_and_the_sweeps_own_lease_is_not_refused(leased):
    crashed("exp-1")
    live_lease("exp-1", ttl=-1.0)  # expired a second ago
    assert own.live_owner("exp-1") is None
    # The recovery sweep of this process takes it over (the lease is now ours, live) and resumes it.
    taken = store_for().takeover("admin-web", 30.0, orphan_after=60.0, max_attempts=5, limit=10,
                                 flows=["admin.crash_once"])
    assert [eid for eid, _ in taken.taken] == ["exp-1"]
    assert own.live_owner("exp-1") is None
    assert resume("exp-1").status == "completed"


def test_resume_without_the_flows_code_refuses_before_taking_over():
    """Reproduces the orphaning resume: UnknownFlow is raised before the fence moves."""
    crashed("nocode-1")
    with connection.cursor() as cursor:
        cursor.execute("UPDATE journal_execution SET flow = 'not.deployed.here' WHERE id = 'nocode-1'")
    with pytest.raises(UnknownFlow):
        resume("nocode-1")
    assert Fence.objects.current("nocode-1") == 1


def test_a_handed_over_resume_does_nothing_if_the_execution_was_taken_over_meanwhile(admin_client):
    crashed("moved-1")
    admin_client.post("/admin/journal/execution/moved-1/resume/")
    assert resume("moved-1").status == "completed"  # someone else (a sweep) got there first
    assert run_queued()[0]["status"] == "completed"  # the outcome, read: nothing was run or taken
    assert Fence.objects.current("moved-1") == 2
    crashed("moved-2")
    admin_client.post("/admin/journal/execution/moved-2/resume/")
    af.CRASH = True
    with pytest.raises(af.Crash):
        resume("moved-2")  # taken over (fence 2) and crashed again: still running
    af.CRASH = False
    assert run_queued()[0]["status"] == "refused"  # handed over at fence 1: not run
    assert Fence.objects.current("moved-2") == 2


# -- retry --------------------------------------------------------------------------------------------
def test_retry_runs_a_new_attempt_from_the_failed_step_and_records_it():
    out = failed("rt-1")
    calls = af.CALLS["rt-1"]
    again = retry("rt-1", actor="ann")
    assert again == Outcome("rt-1", "completed", {"first": 1, "second": 2}, None)
    types = [e.type for e in Event.objects.read("rt-1")]
    assert types.count("STEP_COMPLETED") == 2 and types.count("EXECUTION_FAILED") == 1
    assert types[-4:] == ["EXECUTION_RETRIED", "STEP_STARTED", "STEP_COMPLETED", "EXECUTION_COMPLETED"]
    retried = next(e for e in Event.objects.read("rt-1") if e.type == "EXECUTION_RETRIED").payload
    assert (retried["attempt"], retried["actor"], retried["from_pos"], retried["error"]) == (2, "ann", 1, out.error)
    assert af.CALLS["rt-1"] == calls  # the first step was replayed from the log, not run again
    header = Execution.objects.get(pk="rt-1")
    assert (header.status, header.error) == ("completed", "")
    assert any(row["status"] == "retried" and "asked by ann" in row["note"] for row in describe("rt-1")["steps"])


def test_retry_after_a_settled_snapshot_still_replays_the_completed_steps(settings):
    """A settled checkpoint keeps no step records: the retry event carries them."""
    settings.LOOM_SNAPSHOT_EVERY = 1
    failed("rt-snap")
    calls = af.CALLS["rt-snap"]
    assert retry("rt-snap").status == "completed"
    assert af.CALLS["rt-snap"] == calls


def test_only_a_failed_execution_can_be_retried():
    af.FAIL = False
    start("admin.fail_second", {}, execution_id="rt-ok")
    before = len(Event.objects.read("rt-ok"))
    with pytest.raises(NotResumable, match="only a failed execution can be retried"):
        retry("rt-ok")
    assert len(Event.objects.read("rt-ok")) == before and Fence.objects.current("rt-ok") == 1


def test_retry_button_records_the_attempt_and_hands_it_over(admin_client):
    failed("rt-adm")
    admin_client.post("/admin/journal/execution/rt-adm/retry/")
    assert Execution.objects.get(pk="rt-adm").status == "running"
    assert Event.objects.read("rt-adm")[-1].payload["actor"] == "admin"
    assert run_queued()[0]["status"] == "completed"
    assert Execution.objects.get(pk="rt-adm").status == "completed"


# -- bulk actions ---------------------------------------------------------------------------------------
def test_bulk_actions_show_what_will_happen_before_doing_it(admin_client):
    crashed("bulk-run")
    failed("bulk-failed")
    start("admin.fail_second", {}, execution_id="bulk-ok")
    data = {"action": "cancel_executions", "_selected_action": ["bulk-run", "bulk-failed", "bulk-ok"]}
    page = admin_client.post("/admin/journal/execution/", data)
    body = page.content.decode()
    assert page.status_code == 200 and "will be cancelled" in body and "nothing: already failed" in body
    assert Execution.objects.get(pk="bulk-run").status == "running"  # nothing done yet
    admin_client.post("/admin/journal/execution/", {**data, "post": "yes"})
    statuses = dict(Execution.objects.values_list("id", "status"))
    assert (statuses["bulk-run"], statuses["bulk-failed"], statuses["bulk-ok"]) == ("cancelled", "failed", "completed")
    page = admin_client.post("/admin/journal/execution/", {"action": "retry_executions",
                                                           "_selected_action": ["bulk-failed", "bulk-ok"]})
    assert b"a new attempt from its last completed step" in page.content
    assert b"only a failed execution can be retried (this one is completed)" in page.content


def test_a_select_across_larger_than_one_action_says_how_many_rows_it_leaves(admin_client, settings):
    """Select-all over more rows than one bulk action takes: the confirmation page names what is left out
    (before: it listed the first rows only, and the rest were silently not touched)."""
    from journal import admin as journal_admin

    for n in range(5):
        failed(f"many-{n}")
    limit = journal_admin.BULK_LIMIT
    journal_admin.BULK_LIMIT = 3
    try:
        page = admin_client.post("/admin/journal/execution/", {
            "action": "cancel_executions", "select_across": "1", "index": "0",
            "_selected_action": ["many-0"]})
    finally:
        journal_admin.BULK_LIMIT = limit
    body = page.content.decode()
    assert page.status_code == 200 and 'id="loom-left"' in body
    assert "2 more selected row(s) are not included" in body


# -- permissions --------------------------------------------------------------------------------------
def staff(client, *perms: str) -> User:
    user = User.objects.create_user("op", password="pw", is_staff=True)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename, content_type__app_label="journal"))
    client.force_login(user)
    return user


def test_staff_without_model_permissions_see_no_execution_and_no_event(client):
    """Reproduces the leak: executions (input, result, events) answered 200 to a staff user without permission."""
    start("admin.fail_second", {}, execution_id="secret-1")
    staff(client)
    assert client.get("/admin/journal/execution/").status_code == 403
    assert client.get("/admin/journal/execution/secret-1/change/").status_code == 403
    assert client.get("/admin/journal/event/").status_code == 403
    assert b"secret-1" not in client.get("/admin/").content


def test_view_permission_shows_the_page_without_buttons_and_refuses_the_verbs(client):
    crashed("view-1")
    staff(client, "view_execution")
    page = client.get("/admin/journal/execution/view-1/change/")
    assert page.status_code == 200 and b"Timeline" in page.content
    assert b"loom-resume-button" not in page.content and b"loom-cancel-button" not in page.content
    client.post("/admin/journal/execution/view-1/resume/")
    client.post("/admin/journal/execution/view-1/cancel/", {"confirm": "yes"})
    assert queued() == [] and Execution.objects.get(pk="view-1").status == "running"
    client.post("/admin/journal/execution/", {"action": "cancel_executions", "_selected_action": ["view-1"],
                                              "post": "yes"})
    assert Execution.objects.get(pk="view-1").status == "running"


def test_each_verb_needs_its_own_permission(client):
    crashed("perm-1")
    staff(client, "view_execution", "cancel_execution")
    page = client.get("/admin/journal/execution/perm-1/change/")
    assert b"loom-cancel-button" in page.content and b"loom-resume-button" not in page.content
    client.post("/admin/journal/execution/perm-1/resume/")
    assert queued() == []
    client.post("/admin/journal/execution/perm-1/cancel/", {"confirm": "yes"})
    assert Execution.objects.get(pk="perm-1").status == "cancelled"


def test_every_execution_action_declares_permissions():
    from django.contrib import admin

    model_admin = admin.site._registry[Execution]
    for name in model_admin.actions:
        assert getattr(getattr(model_admin, name), "allowed_permissions", None), name


# -- ids the admin quotes -----------------------------------------------------------------------------
@pytest.mark.parametrize("execution_id", ["order_42", "a/b:c", "x_2Fy"])
def test_pages_and_buttons_work_for_ids_the_admin_quotes(admin_client, execution_id):
    """Reproduces "This header has no events" and the missing buttons for order_42 and ids with / or :."""
    from journal.admin import execution_url

    crashed(execution_id)
    url = execution_url(execution_id)
    page = admin_client.get(url)
    body = page.content.decode()
    assert page.status_code == 200 and "This header has no events" not in body
    assert "loom-resume-button" in body and "Timeline" in body
    admin_client.post(url.replace("/change/", "/resume/"))
    assert [t["args"][0] for t in queued()] == [execution_id]


# -- list filters ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("query", [{"status__exact": "\x00"}, {"flow": "a\x00b"}, {"q": "\x00"},
                                   {"created_at__year": "99999999"}])
def test_list_filters_with_nul_answer_the_invalid_filter_redirect(admin_client, settings, query):
    """The journal admin itself, as embedded in a project without loomsite's NUL-refusing middleware."""
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if not m.startswith("loomsite.")]
    for url in ("/admin/journal/execution/", "/admin/journal/event/", "/admin/journal/fence/"):
        response = admin_client.get(url, query)
        assert response.status_code == 302 and response["Location"].endswith("?e=1"), url


def test_the_status_filter_offers_waiting_and_suspended_now_that_flows_set_them(admin_client):
    page = admin_client.get("/admin/journal/execution/")
    assert b"status__exact=running" in page.content
    assert b"status__exact=waiting" in page.content and b"status__exact=suspended" in page.content


# -- the execution list and page ------------------------------------------------------------------------
def test_an_attempt_interrupted_by_a_crash_is_marked_with_who_recovered_it(admin_client, settings):
    settings.LOOM_WORKER_ID = "worker-x"
    crashed("int-1")
    resume("int-1")
    rows = describe("int-1")["steps"]
    interrupted = [row for row in rows if row["status"] == "interrupted"]
    assert [(row["step"], row["pos"]) for row in interrupted] == [("second", 1)]
    assert interrupted[0]["note"].startswith("interrupted; recovered by worker-x at 20")
    body = admin_client.get("/admin/journal/execution/int-1/change/").content.decode()
    assert "interrupted; recovered by worker-x at" in body and " UTC" in body


def test_a_running_page_refreshes_itself_and_a_settled_one_does_not(admin_client):
    crashed("live-page")
    body = admin_client.get("/admin/journal/execution/live-page/change/").content.decode()
    assert '<meta http-equiv="refresh" content="5">' in body and "running for" in body
    start("admin.fail_second", {}, execution_id="done-page")
    body = admin_client.get("/admin/journal/execution/done-page/change/").content.decode()
    assert 'http-equiv="refresh"' not in body
    assert '{"first": 1, "second": 2}' in body.replace("&quot;", '"')  # payloads as JSON, not Python reprs


def test_the_list_shows_duration_and_step_progress(admin_client):
    start("admin.fail_second", {}, execution_id="list-done")
    crashed("list-run")
    body = admin_client.get("/admin/journal/execution/").content.decode()
    assert "column-progress" in body and "column-duration" in body
    assert "2 steps" in body and "1 step so far" in body and "(running, so far)" in body


def test_the_bulk_resume_refuses_a_healthy_run_and_hands_over_the_others(admin_client, leased):
    """Reproduces the list action that took over a running execution with a live lease."""
    crashed("bulk-busy")
    live_lease("bulk-busy")
    crashed("bulk-dead")
    live_lease("bulk-dead", ttl=-1.0)
    data = {"action": "resume_executions", "_selected_action": ["bulk-busy", "bulk-dead"]}
    page = admin_client.post("/admin/journal/execution/", data).content.decode()
    assert "refused: running under worker worker-b" in page and "handed to a worker, which takes" in page
    admin_client.post("/admin/journal/execution/", {**data, "post": "yes"})
    assert [t["args"][0] for t in queued()] == ["bulk-dead"]
    assert Fence.objects.current("bulk-busy") == 1 and Fence.objects.current("bulk-dead") == 1


def test_resume_of_a_stream_without_an_execution_header_fences_nothing():
    """An aggregate's (or any plain) stream is not an execution: resume must not advance its fence."""
    from journal.envelopes import Envelope
    from journal.flows import UnknownExecution

    Event.objects.open_stream("plain-1", [Envelope("Opened", {})])
    with pytest.raises(UnknownExecution):
        resume("plain-1")
    assert Fence.objects.current("plain-1") == 1
