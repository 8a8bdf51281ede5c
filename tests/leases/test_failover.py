"""High availability (docs/scaling.md "High availability"): the durability check loom.W050 on both backends and
on a real primary with a synchronous standby (the formation of `scripts/ha-servers`); a write or an API start the
database drops is a named, retryable error (DatabaseUnavailable, 503) that wrote nothing, and its retry applies
once. The real failover under load: tests/leases/test_failover_processes.py."""

from __future__ import annotations

import io
import json
import socket

import psycopg
import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.db import OperationalError, connection

from benchmarks.faults import ha
from journal.checks import REPLICATION_SQL, check_failover_durability, failover_loss, run_failover_check
from journal.envelopes import Envelope
from journal.exceptions import DatabaseUnavailable
from journal.models import Event, Execution
from tests.fixtures.api_flows import queued_starts_run_inline

TOKEN = "test-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def formation_or_skip() -> None:
    problem = ha.problem()
    if problem:
        pytest.skip(f"needs the HA formation of scripts/ha-servers: {problem}")


def node(port: int) -> psycopg.Connection:
    return psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres", autocommit=True)


@pytest.mark.django_db
def test_the_check_says_nothing_of_a_server_without_standby_or_of_sqlite():
    """SQLite has no failover (N/A: no message); the suite's PostgreSQL has no standby: nothing to lose."""
    assert check_failover_durability(databases=list(settings.DATABASES)) == []


@pytest.mark.postgres
@pytest.mark.django_db
def test_the_check_connects_only_where_django_runs_database_checks_and_at_a_workers_start():
    """W050 is a database check: `check` (as makemigrations, collectstatic) does not query the server, `check
    --database` (as migrate) and loom_worker/loom_serve_api's start-up (run_failover_check) do."""
    seen: list[str] = []

    def record(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    def queried(run) -> int:
        seen.clear()
        with connection.execute_wrapper(record):
            run()
        return seen.count(REPLICATION_SQL)

    quiet = {"stdout": io.StringIO(), "stderr": io.StringIO(), "fail_level": "CRITICAL"}  # other modules' flows
    assert queried(lambda: call_command("check", **quiet)) == 0
    assert queried(lambda: call_command("check", databases=["default"], **quiet)) == 1
    assert queried(lambda: run_failover_check(BaseCommand(stdout=io.StringIO()), {})) == 1
    assert queried(lambda: run_failover_check(BaseCommand(), {"skip_checks": True})) == 0


@pytest.mark.postgres
def test_the_check_warns_when_commits_are_acknowledged_before_the_standby_has_them():
    formation_or_skip()
    primary = ha.primary_port()
    standby = next(p for p in ha.NODE_PORTS if p != primary)
    with node(primary) as conn, conn.cursor() as cursor:
        assert failover_loss(cursor) is None  # pg_auto_failover: synchronous_standby_names set, commit 'on'
        cursor.execute("SET synchronous_commit = local")
        problem = failover_loss(cursor)
        assert problem is not None and "'local'" in problem
        cursor.execute("SET synchronous_commit = remote_write")  # in the standby's memory: survives the primary
        assert failover_loss(cursor) is None
    with node(standby) as conn, conn.cursor() as cursor:
        assert failover_loss(cursor, several_hosts=True) is None  # a standby is not written to


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again on return: a connection to it is refused


@pytest.fixture
def unreachable():
    """The default connection pointed at a port nobody listens on (a server gone, as in a failover's seconds)."""
    saved = connection.settings_dict["PORT"]

    def cut() -> None:
        connection.close()
        connection.settings_dict["PORT"] = str(_closed_port())

    def restore() -> None:
        connection.close()
        connection.settings_dict["PORT"] = saved

    yield cut, restore
    restore()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_an_append_the_database_drops_is_a_named_retryable_error_and_its_retry_applies_once(unreachable):
    cut, restore = unreachable
    Event.objects.append("ha-e-1", Envelope("Tick", {"n": 0}))
    cut()
    with pytest.raises(DatabaseUnavailable) as raised:
        Event.objects.append("ha-e-1", Envelope("Tick", {"n": 1}), expected_seq=0)
    assert isinstance(raised.value, OperationalError)  # code catching the driver's error still catches it
    assert "in doubt" in str(raised.value)
    restore()
    assert Event.objects.append("ha-e-1", Envelope("Tick", {"n": 1}), expected_seq=0).first_seq == 1
    assert [e.payload["n"] for e in Event.objects.read("ha-e-1")] == [0, 1]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_an_api_start_the_database_drops_is_a_503_to_retry_and_the_retry_runs_it_once(client, settings,
                                                                                       monkeypatch, unreachable):
    settings.LOOM_API_AUTH = True
    settings.LOOM_API_TOKENS = [TOKEN]
    cut, restore = unreachable
    body = json.dumps({"input": {"a": 1, "b": 2}, "execution_id": "ha-api-1"})
    with queued_starts_run_inline(monkeypatch):
        cut()
        response = client.post("/api/flows/calc.add/executions", data=body, content_type="application/json",
                               headers=AUTH)
        assert response.status_code == 503, response.content
        assert response["Retry-After"] == "1"
        assert response.json()["error"]["code"] == "database_unavailable"
        restore()
        assert not Execution.objects.filter(id="ha-api-1").exists()
        again = client.post("/api/flows/calc.add/executions", data=body, content_type="application/json",
                            headers=AUTH)
        assert again.status_code == 202, again.content
        repeat = client.post("/api/flows/calc.add/executions", data=body, content_type="application/json",
                             headers=AUTH)
        assert repeat.status_code == 200 and repeat.json()["created"] is False  # a repeat, never a second run
    assert Execution.objects.get(id="ha-api-1").status == "completed"
    assert Event.objects.filter(stream_id__contains="ha-api-1", type="EXECUTION_STARTED").count() == 1
