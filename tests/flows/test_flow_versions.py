"""Flow versions (docs/flows.md "Versions"): an execution records the version it started on and resumes only
on it; a process without that version leaves it alone (the waker, the recovery sweep, resume); `ctx.patched`
markers keep old executions on the old branch. Both databases; the two-worker deploy is in
tests/flows/test_flow_versions_processes.py."""

from __future__ import annotations

import contextlib
import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from journal.envelopes import Envelope
from journal.flows import UnknownFlow, flow, registry, resume, start, wake_due, wake_now
from journal.flows.ownership import get_ownership, set_ownership
from journal.flows.versions import live_versions
from journal.models import Event, Execution, Fence
from tests.fixtures import version_flows, version_flows_v1, version_flows_v2  # noqa: F401  (registers the flows)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def parked(settings):
    """Every wait parks (only a waker or a resume goes on); this process keeps no leases."""
    settings.LOOM_WAIT_INLINE_MAX = 0.0
    installed = get_ownership()
    set_ownership(None)
    version_flows.CODE.update(variant="old", stop_once=False)
    yield
    set_ownership(installed)
    version_flows.CODE.update(variant="old", stop_once=False)


@contextlib.contextmanager
def release(name: str, *versions: int):
    """This process as a release that has only `versions` of flow `name` (the others hidden meanwhile)."""
    saved = dict(registry._REGISTRY[name])
    registry._REGISTRY[name] = {v: saved[v] for v in versions}
    registry._NEWEST[name] = saved[max(versions)]
    try:
        yield
    finally:
        registry._REGISTRY[name] = saved
        registry._NEWEST[name] = saved[max(saved)]


def started(eid: str) -> dict:
    return Event.objects.read(eid, limit=1)[0].payload


def test_a_version_is_recorded_at_the_start_and_an_execution_resumes_only_on_it():
    with release("ver.order", 1):
        assert start("ver.order", {"n": 5, "wait": "timer"}, execution_id="v-old").status == "waiting"
    assert start("ver.order", {"n": 5, "wait": "timer"}, execution_id="v-new").status == "waiting"
    assert Execution.objects.get(pk="v-old").flow_version == 1
    assert Execution.objects.get(pk="v-new").flow_version == 2
    assert "$version" not in started("v-old")  # absent means 1, as in every log written before versions
    assert started("v-new")["$version"] == 2
    wake_now("v-old")
    wake_now("v-new")
    outcomes = {o.execution_id: o for o in wake_due()}
    assert outcomes["v-old"].status == "completed" and outcomes["v-old"].result["version"] == 1
    assert outcomes["v-new"].status == "completed" and outcomes["v-new"].result["version"] == 2


def test_a_process_without_the_version_claims_none_of_its_waits_and_resume_refuses_before_the_fence():
    with release("ver.order", 1):
        start("ver.order", {"n": 1, "wait": "timer"}, execution_id="v1-wait")
    wake_now("v1-wait")
    fence = Fence.objects.current("v1-wait")
    with release("ver.order", 2):
        assert wake_due() == []  # due, but of a version this process does not have: left alone
        with pytest.raises(UnknownFlow, match="version 1 is not registered"):
            resume("v1-wait", force=True)
    assert Fence.objects.current("v1-wait") == fence  # refused before anything was taken over
    assert Execution.objects.get(pk="v1-wait").status == "waiting"
    [outcome] = wake_due()  # a process that has version 1 takes it
    assert outcome.result["version"] == 1


def test_the_recovery_sweep_takes_only_orphans_of_the_versions_it_has(settings):
    from leases.keeper import LeaseKeeper, reset_keeper
    from leases.ownership import install
    from leases.recovery import sweep

    settings.LOOM_LEASE_MODE, settings.LOOM_LEASE_LAZY_GRACE, settings.LOOM_LEASE_TTL = "eager", 0.0, 10.0
    keeper = LeaseKeeper()
    reset_keeper(keeper)
    install("eager")
    try:
        for eid, version in (("orphan-v1", 1), ("orphan-v2", 2)):
            # A running execution whose owner died after its bootstrap (fence 1, its header, no lease), last
            # updated longer ago than grace + TTL: the sweep's orphan rule (as tests/flows/test_flows_recovery.py).
            Event.objects.open_stream(eid, [
                Envelope("EXECUTION_STARTED", {"flow": "ver.order", "input": {"n": 1}, "$version": version}),
                Envelope("STEP_STARTED", {"step": "reserve", "pos": 0, "attempt": 1})])
            Execution.objects.create(id=eid, flow="ver.order", flow_version=version)
        Execution.objects.filter(pk__in=["orphan-v1", "orphan-v2"]).update(updated_at=timezone.now()
                                                                          - timedelta(minutes=5))
        with release("ver.order", 2):
            taken = sweep("sweeper-v2")
        assert set(taken.flow_of) == {"orphan-v2"}
        with release("ver.order", 1):
            taken = sweep("sweeper-v1")
        assert set(taken.flow_of) == {"orphan-v1"}
    finally:
        keeper.shutdown()
        reset_keeper(None)


def test_flow_versions_list_the_live_executions_of_each_version_and_which_may_be_retired():
    with release("ver.order", 1):
        start("ver.order", {"n": 1}, execution_id="live-v1")
    start("ver.order", {"n": 1}, execution_id="live-v2")
    start("ver.order", {"n": 1, "wait": "timer", "seconds": 0}, execution_id="done-v2")
    wake_due()
    found = {(v.flow, v.version): v for v in live_versions(flow="ver.order")}
    assert found[("ver.order", 1)].live == {"waiting": 1} and not found[("ver.order", 1)].retirable
    assert found[("ver.order", 2)].live == {"waiting": 1}
    version_flows_v1.order_v1  # noqa: B018  (both versions are registered here)
    assert found[("ver.order", 1)].registered and found[("ver.order", 2)].registered
    out = StringIO()
    call_command("loom", "flows", "--flow", "ver.order", "--json", stdout=out)
    data = {(row["flow"], row["version"]): row for row in json.loads(out.getvalue())}
    assert data[("ver.order", 1)]["live_total"] == 1 and data[("ver.order", 1)]["retirable"] is False
    from journal.flows import send

    send("live-v1", "go", None)
    wake_due()
    [v1] = [v for v in live_versions(flow="ver.order") if v.version == 1]
    assert v1.retirable  # nothing of version 1 is live any more: its code may go


def test_a_version_is_an_integer_from_1_and_one_name_and_version_has_one_function():
    with pytest.raises(ValueError, match="flow version must be an integer"):
        flow("ver.bad", version=0)
    with pytest.raises(ValueError, match="flow version must be an integer"):
        flow("ver.bad", version="2")
    with pytest.raises(ValueError, match="version 2 is already registered"):
        flow("ver.order", version=2)(lambda ctx, value: None)


# -- ctx.patched ----------------------------------------------------------------------------------------
def test_patched_keeps_an_execution_started_before_the_marker_on_the_old_branch_and_new_ones_on_the_new():
    version_flows.CODE["variant"] = "old"
    start("ver.patched", {}, execution_id="p-before")  # tax 1, parked on its sleep
    version_flows.CODE["variant"] = "patched"  # the deploy: the marker is in the code now
    start("ver.patched", {}, execution_id="p-after")
    steps_after = [e.payload.get("step") for e in Event.objects.read("p-after") if e.type == "STEP_COMPLETED"]
    assert steps_after[:2] == ["$patch:tax-v2", "tax-v2"]  # the marker is recorded before its branch
    wake_now("p-before")
    wake_now("p-after")
    outcomes = {o.execution_id: o for o in wake_due()}
    # p-before replays tax (the marker's position holds "tax": the old branch) and, past the log's end,
    # takes the new branch of the second marker; p-after keeps the new branch of both.
    assert outcomes["p-before"].status == "completed", outcomes["p-before"].error
    assert outcomes["p-before"].result == {"tax": 1, "late": 20}
    assert outcomes["p-after"].result == {"tax": 2, "late": 20}


def test_patched_takes_the_branch_its_log_recorded_after_the_run_stopped_and_was_resumed():
    version_flows.CODE["variant"] = "old"
    start("ver.patched", {}, execution_id="p-old-stop")
    version_flows.CODE.update(variant="patched", stop_once=True)
    with pytest.raises(version_flows.Stopped):
        start("ver.patched", {}, execution_id="p-new-stop")  # stops in "after": still running
    assert Execution.objects.get(pk="p-new-stop").status == "running"
    assert resume("p-new-stop", force=True).status == "waiting"  # replays the marker: the new branch again
    version_flows.CODE["stop_once"] = True  # the old execution's replay stops too... it has "after" recorded
    assert resume("p-old-stop", force=True).status == "waiting"  # a parked one resumed: replays, parks again
    version_flows.CODE["stop_once"] = False
    for eid in ("p-old-stop", "p-new-stop"):
        wake_now(eid)
    outcomes = {o.execution_id: o for o in wake_due()}
    assert outcomes["p-new-stop"].result["tax"] == 2
    assert outcomes["p-old-stop"].result["tax"] == 1
    taxes = [e.payload["step"] for e in Event.objects.read("p-new-stop")
             if e.type == "STEP_COMPLETED" and e.payload["step"].startswith(("tax", "$patch:tax"))]
    assert taxes == ["$patch:tax-v2", "tax-v2"]  # the branch ran once: the resume replayed it from the log


def test_patched_needs_an_id_the_log_can_hold():
    from journal.flows import InvalidInput, invoke_transient

    @flow("ver.patched-bad")
    def bad(ctx, value):
        return ctx.patched(value)

    assert invoke_transient("ver.patched-bad", "x").result is True  # no recorded past: the new branch
    out = start("ver.patched-bad", "x" * 201)  # over the 200 characters of an id
    assert out.status == "failed" and InvalidInput.__name__ in out.error


def test_a_start_path_that_writes_itself_stamps_through_the_writer():
    from journal.envelopes import Envelope
    from journal.flows import writer

    with release("ver.order", 1, 2):
        envelopes, version = writer.stamp_version("ver.order", [Envelope("EXECUTION_STARTED", {"flow": "ver.order"})])
    assert version == 2 and envelopes[0].payload["$version"] == 2
    kept, version = writer.stamp_version("ver.order", [Envelope("EXECUTION_STARTED", {"$version": 1})])
    assert version == 1 and "$version" in kept[0].payload  # a fork's (or a queued start's) own is kept


def test_bad_flows_options_are_usage_errors():
    with pytest.raises(CommandError) as raised:
        call_command("loom", "flows", "--flow", "x\x00", stdout=StringIO())
    assert raised.value.returncode == 2


def test_a_deprecated_patch_replays_executions_that_recorded_its_marker_and_records_none_for_new_ones():
    version_flows.CODE["variant"] = "patched"
    start("ver.patched", {}, execution_id="p-marked")  # recorded $patch:tax-v2, tax-v2; parked

    def deprecated(ctx, value):  # the next release: the old branch retired, the marker deprecated
        ctx.deprecate_patch("tax-v2")
        tax = ctx.step("tax-v2", lambda: 2)
        ctx.step("after", lambda: "done")
        ctx.sleep(value.get("seconds", 3600))
        ctx.deprecate_patch("late")
        return {"tax": tax, "late": ctx.step("late-v2", lambda: 20)}

    saved = registry._REGISTRY["ver.patched"][1]
    registry._REGISTRY["ver.patched"][1] = registry._NEWEST["ver.patched"] = registry.Flow("ver.patched", deprecated)
    try:
        start("ver.patched", {}, execution_id="p-unmarked")
        wake_now("p-marked")
        wake_now("p-unmarked")
        outcomes = {o.execution_id: o for o in wake_due()}
    finally:
        registry._REGISTRY["ver.patched"][1] = registry._NEWEST["ver.patched"] = saved
    assert outcomes["p-marked"].result == {"tax": 2, "late": 20}, outcomes["p-marked"].error
    assert outcomes["p-unmarked"].result == {"tax": 2, "late": 20}
    steps = [e.payload["step"] for e in Event.objects.read("p-unmarked") if e.type == "STEP_COMPLETED"]
    assert not [s for s in steps if s.startswith("$patch:")]


def test_a_retry_without_the_version_is_refused_before_anything_is_written():
    from journal.flows import retry_execution

    with release("ver.order", 1):
        assert start("ver.order", {}, execution_id="v1-failed").status == "failed"  # KeyError in reserve
    events, fence = len(Event.objects.read("v1-failed")), Fence.objects.current("v1-failed")
    with release("ver.order", 2), pytest.raises(UnknownFlow, match="version 1"):
        retry_execution("v1-failed")
    assert (len(Event.objects.read("v1-failed")), Fence.objects.current("v1-failed")) == (events, fence)
    assert Execution.objects.get(pk="v1-failed").status == "failed"


def test_the_admin_shows_each_version_with_its_live_executions_to_a_viewer_only(client):
    from django.contrib.auth.models import Permission, User

    with release("ver.order", 1):
        start("ver.order", {"n": 1}, execution_id="adm-v1")
    user = User.objects.create_user("op", password="pw", is_staff=True)
    client.force_login(user)
    assert client.get("/admin/journal/execution/flow-versions/").status_code == 403
    user.user_permissions.add(Permission.objects.get(codename="view_execution", content_type__app_label="journal"))
    listing = client.get("/admin/journal/execution/").content.decode()
    assert 'id="loom-flow-versions"' in listing  # the list links to the page
    page = client.get("/admin/journal/execution/flow-versions/")
    body = page.content.decode()
    assert page.status_code == 200
    row = body[body.index("<td>ver.order</td>\n      <td>1</td>"):]
    row = row[:row.index("</tr>")]
    assert "waiting: 1" in row and "not yet" in row
