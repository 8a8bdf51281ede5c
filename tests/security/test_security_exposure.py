"""Internal flows are not reachable from outside (issue 25): `loom.task` imports and calls a task by the
dotted path in its input, so an API token (plain, `*` or `loom.*`) or a staff user who may only add
schedules could run any `@task` with chosen arguments, or import any module. Such a flow, and a flow
outside a token's scope, answers exactly as a flow nobody registered (no enumeration of names), unless
LOOM_EXPOSED_INTERNAL_FLOWS names it.
"""

from __future__ import annotations

import json
import uuid

import pytest
from django.contrib.auth.models import Permission, User

from journal.flows import Context, flow
from journal.flows import ownership as own
from journal.models import Event
from leases.models import Schedule
from tests.fixtures.api_flows import queued_starts_run_inline

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task

pytestmark = pytest.mark.django_db

PLAIN = "plain-token-0123456789abcdef"
STAR = "star-token-0123456789abcdef"
LOOM_STAR = "loomstar-token-0123456789abc"
CALC_ONLY = "calc-token-0123456789abcdef"
TOKENS = [PLAIN, {"token": STAR, "name": "star", "flows": ["*"]},
          {"token": LOOM_STAR, "name": "loomstar", "flows": ["loom.*"]},
          {"token": CALC_ONLY, "name": "calc", "flows": ["calc.*"]}]

CALLED: list[object] = []


@task
def record(value: object) -> str:
    """A project task: what a caller of loom.task could run with arguments of its choosing."""
    CALLED.append(value)
    return "ran"


@flow("tests.exposure.echo")
def echo(ctx: Context, value):
    return value


@pytest.fixture(autouse=True)
def api_settings(settings, monkeypatch):
    settings.LOOM_API_AUTH = True
    settings.LOOM_API_TOKENS = TOKENS
    CALLED.clear()
    with queued_starts_run_inline(monkeypatch):
        yield


def post(client, path: str, body, token: str):
    return client.post(path, data=json.dumps(body), content_type="application/json",
                       headers={"Authorization": f"Bearer {token}"})


TASK_INPUT = {"input": {"task": f"{__name__}.record", "args": ["from outside"], "kwargs": {}}}


def answer(response) -> tuple[int, dict]:
    return response.status_code, response.json()


def unknown_flow_answer(client, token: str, endpoint: str) -> tuple[int, dict]:
    """The answer for a flow nobody registered, with the same body shape."""
    return answer(post(client, f"/api/flows/no.such.flow/{endpoint}", TASK_INPUT, token))


@pytest.mark.parametrize("token", [PLAIN, STAR, LOOM_STAR])
@pytest.mark.parametrize("endpoint", ["call", "executions"])
def test_no_token_calls_or_starts_an_internal_flow(client, token, endpoint):
    """Before: the call answered 200 "ran" (the task ran in the API process with the caller's argument), the
    start 202 queued. Now: 404 unknown_flow, byte for byte the answer for an unregistered name but the name."""
    status, body = answer(post(client, f"/api/flows/loom.task/{endpoint}", TASK_INPUT, token))
    unknown_status, unknown_body = unknown_flow_answer(client, token, endpoint)
    assert (status, body["error"]["code"]) == (unknown_status, unknown_body["error"]["code"]) == (404, "unknown_flow")
    assert body["error"]["message"] == unknown_body["error"]["message"].replace("no.such.flow", "loom.task")
    assert CALLED == []
    assert not Event.objects.exists()


def test_an_out_of_scope_flow_answers_as_an_unknown_one(client):
    """Before: 403 forbidden (a scoped token could tell registered names from others). Now: 404 unknown_flow."""
    for endpoint in ("call", "executions"):
        status, body = answer(post(client, f"/api/flows/tests.exposure.echo/{endpoint}", {"input": 1}, CALC_ONLY))
        unknown_status, unknown_body = answer(post(client, f"/api/flows/tests.exposure.nope/{endpoint}",
                                                   {"input": 1}, CALC_ONLY))
        assert (status, body["error"]["code"]) == (unknown_status, unknown_body["error"]["code"]) \
            == (404, "unknown_flow")
        assert body["error"]["message"] == unknown_body["error"]["message"].replace("nope", "echo")
    assert not Event.objects.exists()
    assert post(client, "/api/flows/tests.exposure.echo/call", {"input": 1}, PLAIN).json()["result"] == 1


def test_an_execution_of_an_internal_flow_is_not_readable_or_retried_through_the_api(client):
    """An existing loom.task execution (enqueued by the code) answers 404 as if it did not exist."""
    from journal.flows import start
    from journal.task_names import sign_task

    path = f"{__name__}.record"  # signed as LoomBackend.enqueue signs it: a real task execution
    start("loom.task", {"task": path, "args": [1], "signature": sign_task("a-task", path)}, execution_id="a-task")
    assert CALLED == [1]
    for token in (PLAIN, STAR, LOOM_STAR):
        response = client.get("/api/executions/a-task", headers={"Authorization": f"Bearer {token}"})
        assert answer(response)[0] == 404 and response.json()["error"]["code"] == "unknown_execution"
        response = post(client, "/api/executions/a-task/retry", {}, token)
        assert response.status_code == 404 and response.json()["error"]["code"] == "unknown_execution"
    assert CALLED == [1]


@flow("loom.tests.exposed_echo")
def exposed_echo(ctx: Context, value):
    """An internal flow (its name starts with loom.) that a project chooses to expose."""
    return value


def test_an_internal_flow_named_by_the_setting_is_exposed_within_the_tokens_scope(client, settings):
    assert post(client, "/api/flows/loom.tests.exposed_echo/call", {"input": 7}, LOOM_STAR).status_code == 404
    settings.LOOM_EXPOSED_INTERNAL_FLOWS = ["loom.tests.exposed_echo"]
    response = post(client, "/api/flows/loom.tests.exposed_echo/call", {"input": 7}, LOOM_STAR)
    assert (response.status_code, response.json()["result"]) == (200, 7)
    # the token's own scope still applies
    assert post(client, "/api/flows/loom.tests.exposed_echo/call", {"input": 7}, CALC_ONLY).status_code == 404


def test_exposing_loom_task_still_runs_no_task_path_a_caller_names(client, settings):
    """Defence in depth: with loom.task exposed, a caller's task path carries no signature of
    LoomBackend.enqueue, so the call fails (UnverifiedTask) and nothing is imported or run."""
    settings.LOOM_EXPOSED_INTERNAL_FLOWS = ["loom.task"]
    response = post(client, "/api/flows/loom.task/call", TASK_INPUT, LOOM_STAR)
    assert (response.status_code, response.json()["status"]) == (200, "failed"), response.json()
    assert "UnverifiedTask" in response.json()["error"]
    assert CALLED == []


# -- the admin's schedule form ------------------------------------------------------------------------------

def schedule_form(**fields) -> dict:
    return {"name": "nightly", "cron": "0 3 * * *", "timezone": "UTC", "flow": "tests.exposure.echo",
            "input": json.dumps(TASK_INPUT["input"]), "catch_up": "skip", "queue": "", "enabled": "on", **fields}


@pytest.fixture
def scheduler(client):
    """A staff user holding only leases.add_schedule (and view, to reach the page)."""
    installed = own.get_ownership()
    own.set_ownership(None)
    user = User.objects.create_user(f"staff-{uuid.uuid4().hex[:8]}", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="leases",
                                                        codename__in=["add_schedule", "view_schedule"]))
    client.force_login(user)
    yield client
    own.set_ownership(installed)


@pytest.mark.parametrize("name", ["loom.task", "loom.anything"])
def test_a_staff_user_who_may_add_schedules_cannot_schedule_an_internal_flow(scheduler, name):
    """Before: loom.task was accepted (302), and every tick ran the task path of the form's input in the
    worker. Now the form says UnknownFlow, as for a name nobody registered, and nothing is written."""
    response = scheduler.post("/admin/leases/schedule/add/", schedule_form(flow=name))
    page = response.content.decode()
    assert response.status_code == 200 and "UnknownFlow" in page and "no flow is registered as" in page
    assert not Schedule.objects.exists()
    assert scheduler.post("/admin/leases/schedule/add/", schedule_form()).status_code == 302
    assert list(Schedule.objects.values_list("flow", flat=True)) == ["tests.exposure.echo"]


def test_the_setting_lets_the_schedule_form_name_an_exposed_internal_flow(scheduler, settings):
    settings.LOOM_EXPOSED_INTERNAL_FLOWS = ["loom.task"]
    assert scheduler.post("/admin/leases/schedule/add/", schedule_form(flow="loom.task")).status_code == 302
    assert Schedule.objects.get().flow == "loom.task"
