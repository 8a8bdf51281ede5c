"""serve_api for real: gunicorn with worker processes on loopback, then the parent SIGKILLed."""

from __future__ import annotations

import http.client
import json
import os
import signal
import time

import pytest
from django.db import connection

from loomapi.process import children, free_port, kill_all, server_log, spawn_server, wait_gone, wait_ready

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "server-test-token-0123456789"


def other_sessions() -> list[tuple]:
    """PostgreSQL sessions on the test database besides ours (none on SQLite)."""
    if connection.vendor != "postgresql":
        return []
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid, application_name, state, backend_start, query FROM pg_stat_activity "
                       "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        return cursor.fetchall()


def wait_sessions_closed(baseline: int, timeout: float = 10.0) -> list[tuple]:
    """Sessions beyond `baseline` (those open before the server started, e.g. another thread of this
    process); a dead process's backend ends a moment after its socket closes, so poll, bounded."""
    deadline = time.monotonic() + timeout
    while len(other_sessions()) > baseline and time.monotonic() < deadline:
        time.sleep(0.05)
    sessions = other_sessions()
    return sessions if len(sessions) > baseline else []


def request(conn: http.client.HTTPConnection, method: str, path: str, body=None) -> tuple[int, dict, str]:
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
    response = conn.getresponse()
    return response.status, json.loads(response.read()), response.getheader("X-Loom-Worker")


def test_workers_serve_requests_and_exit_when_the_parent_is_sigkilled(child_env):
    """The arbiter dies without a chance to clean up; every worker must still go (no orphans)."""
    env = {**child_env, "LOOM_API_TOKENS": TOKEN, "LOOM_API_AUTH": "true"}
    port = free_port()
    baseline = len(other_sessions())
    server = spawn_server(2, port, env)
    workers: set[int] = set()
    try:
        workers = wait_ready(server, port, "/api/health", workers=2)
        assert len(workers) == 2
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        served_by = set()
        for a in range(10):
            status, body, worker = request(conn, "POST", "/api/flows/calc.add/call", {"input": {"a": a, "b": 1}})
            assert (status, body["result"]) == (200, a + 1)
            served_by.add(int(worker))
        status, body, _ = request(conn, "POST", "/api/flows/calc.add/executions",
                                  {"input": {"a": 2, "b": 3}, "execution_id": "served"})
        assert (status, body["result"]) == (201, 5)
        status, body, _ = request(conn, "GET", "/api/executions/served")
        assert (status, body["status"]) == (200, "completed")
        conn.close()
        assert served_by <= workers  # the workers answer, not the arbiter

        os.kill(server.pid, signal.SIGKILL)
        server.wait(timeout=10)
        left = wait_gone(workers, timeout=20)
        assert left == set(), f"orphaned workers {left}:\n{server_log(server)}"
        assert wait_sessions_closed(baseline) == []  # nor a database session of theirs
    finally:
        kill_all({server.pid, *workers, *children(server.pid)}, signal.SIGKILL)
        server.wait(timeout=10)
        server.log.close()


def test_serve_api_refuses_to_start_without_tokens_when_auth_is_on(child_env):
    env = {**child_env, "LOOM_API_AUTH": "true"}
    env.pop("LOOM_API_TOKENS", None)
    baseline = len(other_sessions())
    server = spawn_server(1, free_port(), env)
    try:
        assert server.wait(timeout=60) != 0
        assert "LOOM_API_TOKENS is empty" in server_log(server)
    finally:
        kill_all({server.pid}, signal.SIGKILL)
        server.log.close()
        wait_sessions_closed(baseline)
