"""No existence oracle on reads (issue #25): every endpoint answers an execution the token may not read exactly
as an id that does not exist (404, the same body but for the id). The durable start's conflict answer is
tested beside the start (tests/api/test_api_safety.py)."""

from __future__ import annotations

import json

import pytest

from tests.fixtures.api_flows import queued_starts_run_inline

pytestmark = pytest.mark.django_db

FULL = "full-token-0123456789abcdef"
OWN_ONLY = "own-token-0123456789abcdef"
CALC_ONLY = "calc-token-0123456789abcdef"


@pytest.fixture(autouse=True)
def api_settings(settings, monkeypatch):
    settings.LOOM_API_AUTH = True
    settings.LOOM_API_TOKENS = [FULL, {"token": OWN_ONLY, "name": "own", "read": "own"},
                                {"token": CALC_ONLY, "name": "calc", "flows": ["nothing.*"]}]
    with queued_starts_run_inline(monkeypatch):
        yield


def start(client, execution_id: str) -> None:
    response = client.post("/api/flows/calc.add/executions", content_type="application/json",
                           data=json.dumps({"input": {"a": 1, "b": 2}, "execution_id": execution_id}),
                           headers={"Authorization": f"Bearer {FULL}"})
    assert response.status_code in (200, 201, 202), response.content


def answer(client, method: str, path: str, token: str) -> tuple[int, str]:
    body = json.dumps({"topic": "t", "payload": 1}) if method == "POST" else None
    call = client.post if method == "POST" else client.get
    kwargs = {"data": body, "content_type": "application/json"} if body else {}
    response = call(path, headers={"Authorization": f"Bearer {token}"}, **kwargs)
    return response.status_code, response.content.decode()


ENDPOINTS = [("GET", "/api/executions/{id}"), ("GET", "/api/executions/{id}/retry"),
             ("GET", "/api/executions/{id}/messages"), ("POST", "/api/executions/{id}/retry"),
             ("POST", "/api/executions/{id}/messages"), ("GET", "/api/executions/{id}/events/k"),
             ("GET", "/api/executions/{id}/events/k?timeout=0.1")]


@pytest.mark.parametrize("token", [OWN_ONLY, CALC_ONLY])
@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
def test_an_execution_the_token_may_not_read_answers_as_an_unknown_one(client, token, method, path):
    start(client, "hidden-0001")
    hidden = answer(client, method, path.format(id="hidden-0001"), token)
    unknown = answer(client, method, path.format(id="absent-0001"), token)
    assert hidden[0] == 404
    assert hidden == (unknown[0], unknown[1].replace("absent-0001", "hidden-0001"))


@pytest.mark.parametrize("token", [OWN_ONLY, CALC_ONLY])
def test_an_event_path_naming_a_hidden_execution_with_slashes_answers_as_an_unknown_one(client, token):
    """ids may hold "/": GET .../hid/events/k also reads an execution named "hid/events/k". Before, an
    unreadable one of that name was answered naming it, and an absent one naming "hid": an oracle."""
    start(client, "hid/events/k")
    hidden = answer(client, "GET", "/api/executions/hid/events/k", token)
    unknown = answer(client, "GET", "/api/executions/nox/events/k", token)
    assert hidden[0] == 404
    assert hidden == (unknown[0], unknown[1].replace("nox", "hid"))
    assert answer(client, "GET", "/api/executions/hid/events/k", FULL)[0] == 200  # the full token reads it
