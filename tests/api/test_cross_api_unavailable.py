"""Across the HTTP API and high availability (issue 31): with the database unreachable (the connection pointed at
a port where nothing listens, as during a failover's seconds; no server is stopped), EVERY API route that reads or
writes the database answers `503 database_unavailable` with `Retry-After` and a one-line reason, never a 500 or a
traceback; the routes that need no database (health, a transient call) still answer, and the metrics page
answers with the process's counters and `loom_scrape_database_ok 0` for the database (its gauges absent, as a
Prometheus scrape wants: a 503 would lose the counters too); once it is back, each route answers as usual.
PostgreSQL (SQLite has no server to lose)."""

from __future__ import annotations

import json

import pytest
from django.db import connection

from journal.flows import start
from tests.fixtures import api_flows  # noqa: F401  (calc.*)
from tests.leases.test_failover import unreachable  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

TOKEN = "cross-unavailable-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

# (method, path, body): every route of loomapi/urls.py that touches the database
ROUTES = [
    ("POST", "/api/flows/calc.add/executions", {"input": {"a": 1, "b": 2}, "execution_id": "cu-new"}),
    ("GET", "/api/executions", None),
    ("GET", "/api/executions?status=failed&limit=5", None),
    ("GET", "/api/executions/cu-1", None),
    ("HEAD", "/api/executions/cu-1", None),
    ("POST", "/api/executions/cu-1/retry", None),
    ("POST", "/api/executions/cu-1/cancel", None),
    ("GET", "/api/executions/cu-1/cancel", None),
    ("POST", "/api/executions/cu-1/messages", {"topic": "t", "payload": {"n": 1}}),
    ("GET", "/api/executions/cu-1/events/k?timeout=0", None),
]


def call(client, method: str, path: str, body):
    data = "" if body is None else json.dumps(body)
    return client.generic(method, path, data=data, content_type="application/json", headers=AUTH)


@pytest.fixture
def api(settings):
    settings.LOOM_API_AUTH = True
    settings.LOOM_API_TOKENS = [TOKEN]
    settings.LOOM_METRICS = True
    start("calc.add", {"a": 1, "b": 1}, execution_id="cu-1", queue="default", delay=3600)  # queued, waits


@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=[f"{m} {p}" for m, p, _ in ROUTES])
def test_every_route_answers_503_to_retry_while_the_database_cannot_be_reached(client, api, unreachable,  # noqa: F811
                                                                                method, path, body):
    cut, restore = unreachable
    cut()
    response = call(client, method, path, body)
    restore()
    assert response.status_code == 503, response.content
    assert response["Retry-After"] == "1"
    if method != "HEAD":
        error = response.json()["error"]
        assert error["code"] == "database_unavailable" and "could not be reached" in error["message"], error
        assert "Traceback" not in error["message"] and "\n" not in error["message"]
    again = call(client, method, path, body)
    assert again.status_code < 500, again.content  # back: the route answers as it does


def test_the_routes_that_need_no_database_still_answer(client, api, unreachable):  # noqa: F811
    cut, restore = unreachable
    cut()
    try:
        assert client.get("/api/health").status_code == 200
        done = call(client, "POST", "/api/flows/calc.add/call", {"input": {"a": 2, "b": 40}})
        assert done.status_code == 200 and done.json()["result"] == 42, done.content
        assert call(client, "GET", "/api/nothing-here", None).status_code == 404
        page = call(client, "GET", "/api/metrics", None)
    finally:
        restore()
    assert page.status_code == 200, page.content
    text = page.content.decode()
    assert 'loom_scrape_database_ok{alias="default"} 0.0' in text and "loom_api_requests_total" in text
    assert "loom_executions{" not in text and "loom_queue_depth{" not in text  # read from the database: absent
    back = call(client, "GET", "/api/metrics", None).content.decode()
    assert 'loom_scrape_database_ok{alias="default"} 1.0' in back and "loom_queue_depth{" in back
    assert connection.settings_dict["PORT"] != ""  # restored: the test database is dropped at the end
