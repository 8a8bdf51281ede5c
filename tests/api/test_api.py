"""The HTTP API through Django's test client: every endpoint, and every documented error status and body."""

from __future__ import annotations

import json
import logging

import pytest
from django.test import Client

from journal.flows import Context, flow
from journal.models import Event
from tests.fixtures.api_flows import queued_starts_run_inline

pytestmark = pytest.mark.django_db

TOKEN = "test-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@flow("tests.api.broken_state")
def broken_state(ctx: Context, call):
    """Breaks the caller-owned-state contract: returns a bare number."""
    return 42


@flow("tests.api.fails")
def fails(ctx: Context, value):
    def boom():
        raise RuntimeError("the flow's own failure")

    return ctx.step("boom", boom)


@pytest.fixture(autouse=True)
def api_settings(settings, monkeypatch):
    settings.LOOM_API_AUTH = True
    settings.LOOM_API_TOKENS = [TOKEN]
    settings.LOOM_API_MAX_BODY_BYTES = 1024
    # Queued starts run inside enqueue_start, in this process (tests/api/test_api_server.py runs the real
    # thing: serve_api and a loom_worker).
    with queued_starts_run_inline(monkeypatch):
        yield


def post(client, path: str, body, **headers):
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return client.post(path, data=data, content_type=headers.pop("content_type", "application/json"),
                       headers={**AUTH, **headers})


def assert_error(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json"
    error = response.json()["error"]
    assert error["code"] == code
    assert error["message"]
    return error


def test_transient_call_answers_the_sum_and_writes_nothing(client):
    response = post(client, "/api/flows/calc.add/call", {"input": {"a": 2, "b": 40}})
    assert response.status_code == 200
    assert response.json() == {"status": "completed", "result": 42, "error": None}
    assert response["X-Loom-Worker"].isdigit()
    assert Event.objects.count() == 0


def test_caller_owned_state_round_trips_and_the_server_keeps_nothing(client):
    """The caller sends its state back each time; the flow's arithmetic follows it; no row is written."""
    state = {}
    for n, expected in ((5, 5), (7, 12), (30, 42)):
        response = post(client, "/api/flows/calc.accumulate/call", {"input": {"n": n}, "state": state})
        assert response.status_code == 200, response.content
        body = response.json()
        assert body["result"] == expected
        state = body["state"]
    assert state == {"total": 42, "calls": 3}
    # Another caller with its own state is unaffected by the first one's history.
    other = post(client, "/api/flows/calc.accumulate/call", {"input": {"n": 1}, "state": {"total": 100}})
    assert other.json()["state"] == {"total": 101, "calls": 1}
    assert Event.objects.count() == 0


def test_start_is_queued_for_a_worker_and_answered_202_with_its_location(client):
    """The request does not run the flow: 202 and a Location at once (here django-q2's sync mode has
    run the queued start by the time the response is read, so the status shows its outcome)."""
    response = post(client, "/api/flows/calc.add/executions", {"input": {"a": 1, "b": 2}, "execution_id": "e-1"})
    assert response.status_code == 202
    assert response["Location"] == "/api/executions/e-1"
    assert response.json() == {"execution_id": "e-1", "flow": "calc.add", "status": "queued", "result": None,
                               "error": None, "created": True}
    status = client.get("/api/executions/e-1", headers=AUTH)
    assert status.status_code == 200
    body = status.json()
    assert (body["status"], body["result"], body["input"]) == ("completed", 3, {"a": 1, "b": 2})
    assert [e["type"] for e in body["events"]] == ["EXECUTION_STARTED", "STEP_STARTED", "STEP_COMPLETED",
                                                   "EXECUTION_COMPLETED"]


def test_start_with_wait_answers_201_with_the_outcome(client):
    response = post(client, "/api/flows/calc.add/executions?wait=5", {"input": {"a": 1, "b": 2}, "execution_id": "w"})
    assert response.status_code == 201
    assert response["Location"] == "/api/executions/w"
    assert response.json() == {"execution_id": "w", "flow": "calc.add", "status": "completed", "result": 3,
                               "error": None, "created": True}


@pytest.mark.parametrize("wait", ["-1", "abc", "nan", "31", "inf"])
def test_a_wait_outside_the_bound_is_400_and_nothing_is_queued(client, wait):
    response = post(client, f"/api/flows/calc.add/executions?wait={wait}", {"input": {"a": 1, "b": 2}})
    assert_error(response, 400, "invalid_parameter")
    assert Event.objects.count() == 0


def test_start_without_an_id_mints_one(client):
    response = post(client, "/api/flows/calc.add/executions", {"input": {"a": 1, "b": 1}})
    assert response.status_code == 202
    execution_id = response.json()["execution_id"]
    assert client.get(f"/api/executions/{execution_id}", headers=AUTH).json()["result"] == 2


def test_repeated_start_with_the_same_id_returns_the_existing_execution(client):
    body = {"input": {"a": 1, "b": 2}, "execution_id": "same"}
    assert post(client, "/api/flows/calc.add/executions", body).status_code == 202
    rows = Event.objects.count()
    again = post(client, "/api/flows/calc.add/executions", body)
    assert again.status_code == 200
    assert again.json() == {"execution_id": "same", "flow": "calc.add", "status": "completed", "result": 3,
                            "error": None, "created": False}
    assert Event.objects.count() == rows  # nothing ran a second time


def test_reusing_an_id_with_another_flow_is_a_conflict_and_another_input_answers_the_execution(client):
    """Issue #25: a repeat is decided by flow and starter, never by the input (comparing a guessed input with
    the decrypted stored one was an oracle): the same token's start with another input gets its execution."""
    post(client, "/api/flows/calc.add/executions", {"input": {"a": 1, "b": 2}, "execution_id": "k"})
    rows = Event.objects.count()
    again = post(client, "/api/flows/calc.add/executions", {"input": {"a": 9, "b": 2}, "execution_id": "k"})
    assert (again.status_code, again.json()["created"], again.json()["result"]) == (200, False, 3)
    assert_error(post(client, "/api/flows/calc.accumulate/executions",
                      {"input": {"n": 1}, "state": {}, "execution_id": "k"}), 409, "execution_conflict")
    assert Event.objects.count() == rows


def test_durable_start_with_caller_owned_state_stores_the_flows_return_value(client):
    response = post(client, "/api/flows/calc.accumulate/executions?wait=5",
                    {"input": {"n": 2}, "state": {"total": 3, "calls": 4}, "execution_id": "acc"})
    assert response.status_code == 201
    assert response.json()["result"] == {"result": 5, "state": {"total": 5, "calls": 5}}


def test_a_failing_flow_is_reported_as_failed_not_as_a_server_error(client):
    call = post(client, "/api/flows/tests.api.fails/call", {"input": {}})
    assert call.status_code == 200
    assert call.json()["status"] == "failed"
    assert "the flow's own failure" in call.json()["error"]
    started = post(client, "/api/flows/tests.api.fails/executions?wait=5", {"input": {}, "execution_id": "f"})
    assert started.status_code == 201
    assert started.json()["status"] == "failed"


@pytest.mark.parametrize("path", ["/api/flows/nope/call", "/api/flows/nope/executions"])
def test_unknown_flow_is_404(client, path):
    assert "nope" in assert_error(post(client, path, {"input": {}}), 404, "unknown_flow")["message"]


def test_unknown_execution_is_404(client):
    assert_error(client.get("/api/executions/missing", headers=AUTH), 404, "unknown_execution")


def test_unknown_route_under_the_prefix_is_a_json_404(client):
    assert_error(client.get("/api/nowhere", headers=AUTH), 404, "not_found")


@pytest.mark.parametrize("body", [
    {"input": {"a": -1, "b": 2}},           # not a natural
    {"input": {"a": "1", "b": 2}},          # strict: no string coercion
    {"input": {"a": 1}},                    # missing b
    {"input": {"a": 1, "b": 2}, "state": {}},  # a stateless flow called with state
])
def test_invalid_input_is_422_and_writes_nothing(client, body):
    assert_error(post(client, "/api/flows/calc.add/call", body), 422, "invalid_input")
    assert_error(post(client, "/api/flows/calc.add/executions", body), 422, "invalid_input")
    assert Event.objects.count() == 0


def test_stateful_flow_without_state_is_422(client):
    assert_error(post(client, "/api/flows/calc.accumulate/call", {"input": {"n": 1}}), 422, "invalid_input")


@pytest.mark.parametrize("raw", ['{"input": ', "not json", b"\xff\xfe"])
def test_malformed_json_is_400(client, raw):
    assert_error(post(client, "/api/flows/calc.add/call", raw), 400, "malformed_json")


@pytest.mark.parametrize("body", [
    [1, 2],                                           # not an object
    {"a": 1, "b": 2},                                 # input not under "input"
    {"input": {}, "extra": 1},                        # unknown key
    {"input": {}, "state": [1]},                      # state not an object
    {"input": {"a": 1, "b": 1}, "execution_id": 7},   # id not a string
    {"input": {"a": 1, "b": 1}, "execution_id": "has space"},
])
def test_body_of_the_wrong_shape_is_400(client, body):
    assert_error(post(client, "/api/flows/calc.add/executions", body), 400, "invalid_body")
    assert Event.objects.count() == 0


def test_call_body_does_not_take_an_execution_id(client):
    body = {"input": {"a": 1, "b": 1}, "execution_id": "x"}
    assert_error(post(client, "/api/flows/calc.add/call", body), 400, "invalid_body")


def test_oversize_body_is_413_and_writes_nothing(client):
    body = {"input": {"a": 1, "b": 2}, "execution_id": "x" * 10, "pad": "y" * 2000}
    assert_error(post(client, "/api/flows/calc.add/executions", body), 413, "payload_too_large")
    assert Event.objects.count() == 0


def test_wrong_content_type_is_415(client):
    response = client.post("/api/flows/calc.add/call", data={"input": "1"}, headers=AUTH)
    assert_error(response, 415, "unsupported_media_type")


@pytest.mark.parametrize(("method", "path", "allow"), [
    ("get", "/api/flows/calc.add/call", "POST"),
    ("put", "/api/flows/calc.add/executions", "POST"),
    ("post", "/api/executions/x", "GET, HEAD"),
    ("delete", "/api/executions/x", "GET, HEAD"),
])
def test_wrong_method_is_405_with_allow(client, method, path, allow):
    response = getattr(client, method)(path, headers=AUTH)
    assert_error(response, 405, "method_not_allowed")
    assert response["Allow"] == allow


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong-token"}, {"Authorization": "Basic abc"},
                                     {"Authorization": "Bearer "}])
def test_unauthenticated_request_is_refused_when_auth_is_on(client, headers):
    response = client.post("/api/flows/calc.add/executions", data={"input": {"a": 1, "b": 1}},
                           content_type="application/json", headers=headers)
    assert_error(response, 401, "unauthorized")
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert Event.objects.count() == 0


def test_auth_off_accepts_requests_without_a_token(client, settings):
    settings.LOOM_API_AUTH = False
    response = client.post("/api/flows/calc.add/call", data={"input": {"a": 1, "b": 1}},
                           content_type="application/json")
    assert response.json()["result"] == 2


def test_auth_on_without_tokens_refuses_everything(client, settings):
    settings.LOOM_API_TOKENS = []
    assert_error(post(client, "/api/flows/calc.add/call", {"input": {"a": 1, "b": 1}}), 401, "unauthorized")


def test_token_api_is_csrf_exempt(settings):
    client = Client(enforce_csrf_checks=True)
    response = post(client, "/api/flows/calc.add/call", {"input": {"a": 1, "b": 1}})
    assert response.status_code == 200


def test_admin_keeps_djangos_own_auth(client):
    """A bearer token is no login: the admin still redirects to its login page."""
    response = client.get("/admin/", headers=AUTH)
    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]


def test_server_error_is_json_with_an_id_and_no_traceback(client, caplog):
    """A flow that breaks the caller-owned-state contract: 500, an id, the traceback only in the log."""
    with caplog.at_level(logging.ERROR, logger="loomapi"):
        response = post(client, "/api/flows/tests.api.broken_state/call", {"input": {}, "state": {}})
    error = assert_error(response, 500, "internal_error")
    assert len(error["id"]) == 32
    assert error["id"] in error["message"]
    assert b"Traceback" not in response.content and b"StateContractBroken" not in response.content
    logged = [r for r in caplog.records if error["id"] in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is not None


def test_health_needs_no_token_and_no_database(client, django_assert_num_queries):
    with django_assert_num_queries(0):
        response = client.get("/api/health")
    assert response.json() == {"status": "ok"}
