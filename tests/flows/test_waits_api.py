"""The HTTP API of flows that wait: POST /api/executions/<id>/messages and GET .../events/<key>.

Executions are started and woken in this process (`start`, `wake_due`), as an embedding project or a
test does; the API is driven through Django's test client. Every refusal is checked for the API's one
error shape and for having written nothing.
"""

from __future__ import annotations

import json

import pytest
from django.test import Client

from journal.flows import ownership, start
from journal.models import Event, Execution
from tests.fixtures import edge_waits_flows

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "waits-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SCOPED = "waits-scoped-0123456789abcdef"


@pytest.fixture(autouse=True)
def api_settings(settings, transactional_db):
    settings.LOOM_API_AUTH = True
    settings.LOOM_API_TOKENS = [TOKEN, {"token": SCOPED, "name": "scoped", "flows": ["calc.*"]}]
    settings.LOOM_WAIT_INLINE_MAX = 0.0  # every wait parks: nothing sleeps in the test's thread
    settings.LOOM_FLOW_MODULES = ["tests.fixtures.edge_waits_flows"]
    edge_waits_flows.create_effects_table()
    installed = ownership.get_ownership()
    ownership.set_ownership(None)  # no lease keeper thread in the test process (it would outlive the test database)
    yield
    ownership.set_ownership(installed)


def post(client: Client, path: str, body, token: str = TOKEN):
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return client.post(path, data=data, content_type="application/json", headers={"Authorization": f"Bearer {token}"})


def assert_error(response, status: int, code: str) -> str:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json"
    error = response.json()["error"]
    assert error["code"] == code and error["message"] and set(error) == {"code", "message", "id"}
    return error["message"]


def rows() -> tuple[int, int]:
    """What a refused request must not change: events and messages."""
    from journal.models import Message

    return Event.objects.count(), Message.objects.count()


def wake_all() -> None:
    from journal.flows import wake_due

    for _ in range(20):  # a woken flow may park again on something already due
        if not wake_due():
            return


def test_a_message_posted_to_a_waiting_flow_is_received_once_and_its_event_read(client):
    assert start("edge.receiver", {"topic": "go"}, execution_id="api-r1").status == "waiting"
    unset = client.get("/api/executions/api-r1/events/got", headers=AUTH)
    assert unset.status_code == 200 and unset.json() == {"execution_id": "api-r1", "key": "got", "set": False,
                                                         "value": None}
    first = post(client, "/api/executions/api-r1/messages", {"topic": "go", "payload": {"n": 7}, "message_id": "m-1"})
    assert first.status_code == 202, first.content
    assert first.json() == {"execution_id": "api-r1", "topic": "go", "message_id": "m-1", "status": "accepted"}
    assert first["Location"] == "/api/executions/api-r1"
    again = post(client, "/api/executions/api-r1/messages", {"topic": "go", "payload": {"n": 8}, "message_id": "m-1"})
    assert again.status_code == 202 and again.json()["message_id"] == "m-1"  # idempotent: nothing new
    wake_all()
    assert Execution.objects.get(pk="api-r1").status == "completed"
    got = client.get("/api/executions/api-r1/events/got?timeout=1", headers=AUTH)
    assert got.status_code == 200 and got.json()["set"] is True and got.json()["value"] == {"n": 7}
    assert edge_waits_flows.effects("api-r1") == [("api-r1", "before"), ("api-r1", "got:{'n': 7}")]


def test_a_message_without_message_id_gets_a_minted_one_and_messages_before_the_wait_are_kept(client):
    assert start("edge.counter", {"n": 2}, execution_id="api-c1").status == "waiting"
    ids = {post(client, "/api/executions/api-c1/messages", {"topic": "add", "payload": n}).json()["message_id"]
           for n in (5, 6)}
    assert len(ids) == 2 and all(ids)
    wake_all()
    assert Execution.objects.get(pk="api-c1").result == 11
    assert client.get("/api/executions/api-c1/events/total", headers=AUTH).json()["value"] == 11


def test_a_message_to_a_finished_execution_is_refused_and_writes_nothing(client):
    assert start("edge.steps", {"n": 1}, execution_id="api-done").status == "completed"
    before = rows()
    message = assert_error(post(client, "/api/executions/api-done/messages", {"topic": "t", "payload": 1}),
                           409, "execution_finished")
    assert "api-done" in message
    assert rows() == before


@pytest.mark.parametrize("body, code", [
    ({"payload": 1}, "invalid_body"),                              # no topic
    ({"topic": "", "payload": 1}, "invalid_body"),                 # empty topic
    ({"topic": 5, "payload": 1}, "invalid_body"),                  # topic not a string
    ({"topic": "t" * 201, "payload": 1}, "invalid_body"),          # topic too long
    ({"topic": "t"}, "invalid_body"),                              # no payload
    ({"topic": "t", "payload": 1, "extra": 2}, "invalid_body"),    # unknown key
    ({"topic": "t", "payload": 1, "message_id": ""}, "invalid_body"),
    ({"topic": "t", "payload": 1, "message_id": "a b"}, "invalid_body"),
    ([1, 2], "invalid_body"),
    ('{"topic": "t", "payload": NaN}', "malformed_json"),
    ('{"topic": "t", "payload": "\\u0000"}', "invalid_body"),
    ("not json", "malformed_json"),
])
def test_bad_message_bodies_get_the_api_error_shape_and_write_nothing(client, body, code):
    start("edge.receiver", {"topic": "go"}, execution_id="api-bad")
    before = rows()
    assert_error(post(client, "/api/executions/api-bad/messages", body), 400, code)
    assert rows() == before


def test_unknown_executions_and_unscoped_tokens_get_404(client):
    start("edge.receiver", {"topic": "go"}, execution_id="api-scope")
    before = rows()
    assert_error(post(client, "/api/executions/nope/messages", {"topic": "t", "payload": 1}), 404,
                 "unknown_execution")
    assert_error(client.get("/api/executions/nope/events/k", headers=AUTH), 404, "unknown_execution")
    # a token scoped to calc.* may not read or message an edge.* execution: 404, as if it did not exist
    assert_error(post(client, "/api/executions/api-scope/messages", {"topic": "go", "payload": 1}, token=SCOPED),
                 404, "unknown_execution")
    assert_error(client.get("/api/executions/api-scope/events/got", headers={"Authorization": f"Bearer {SCOPED}"}),
                 404, "unknown_execution")
    assert_error(client.post("/api/executions/api-scope/messages", data="{}", content_type="application/json"),
                 401, "unauthorized")
    assert rows() == before


@pytest.mark.parametrize("timeout", ["-1", "nan", "abc", "31", "inf"])
def test_a_bad_timeout_is_an_invalid_parameter(client, timeout):
    start("edge.receiver", {"topic": "go"}, execution_id="api-to")
    assert_error(client.get(f"/api/executions/api-to/events/got?timeout={timeout}", headers=AUTH), 400,
                 "invalid_parameter")


def test_wrong_methods_answer_405_and_ids_ending_in_the_route_words_stay_readable(client):
    start("edge.steps", {"n": 1}, execution_id="x/messages")
    start("edge.steps", {"n": 1}, execution_id="y/events/k")
    assert client.get("/api/executions/x/messages", headers=AUTH).json()["status"] == "completed"
    assert client.get("/api/executions/y/events/k", headers=AUTH).json()["status"] == "completed"
    response = client.delete("/api/executions/x/messages", headers=AUTH)
    assert_error(response, 405, "method_not_allowed")
    assert "POST" in response["Allow"]
    assert_error(post(client, "/api/executions/api-x/events/k", {}), 405, "method_not_allowed")


def test_an_event_read_with_a_timeout_waits_for_the_flow_to_set_it(client):
    """The GET waits: the message is received (and the event set) by another thread while it waits."""
    import threading

    from django.db import connections

    start("edge.receiver", {"topic": "go"}, execution_id="api-wait")
    post(client, "/api/executions/api-wait/messages", {"topic": "go", "payload": "late"})

    def waker() -> None:
        try:
            threading.Event().wait(0.3)
            wake_all()
        finally:
            connections.close_all()

    thread = threading.Thread(target=waker)
    thread.start()
    try:
        got = client.get("/api/executions/api-wait/events/got?timeout=20", headers=AUTH)
    finally:
        thread.join()
    assert got.status_code == 200 and got.json() == {"execution_id": "api-wait", "key": "got", "set": True,
                                                     "value": "late"}
