"""Shared fixtures: the database under test, child processes that use it, statement counting.

The suite runs against whatever DATABASE_URL points at (SQLite by default). Tests marked
`postgres` are skipped on SQLite with the reason; everything else must pass on both.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from benchmarks.faults.processes import database_url
from tests.fixtures.flows_fixtures import EFFECTS_TABLE

ROOT = Path(__file__).resolve().parent.parent


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("postgres") and connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL (run with DATABASE_URL=postgres://...)")


# Skip reasons that mean "a server or package this machine lacks" (the shard servers, PgBouncer, Chromium,
# root). Locally such a test skips with its reason; under CI (CI=true) .ci/run installs and starts all of
# them, so the same skip is a failure: a test skipping there would hide a gap behind a green run.
MISSING_PARTS = ("scripts/shard-servers", "/usr/bin/chromium", "CI runs as root", "scripts/conformance-sources",
                 "scripts/spike-server", "scripts/ha-servers", "/usr/bin/prometheus")


def _fail_missing_part_under_ci(report: pytest.TestReport | pytest.CollectReport) -> None:
    if os.environ.get("CI") != "true" or not report.skipped or not isinstance(report.longrepr, tuple):
        return
    reason = str(report.longrepr[2])
    if any(part in reason for part in MISSING_PARTS):
        report.outcome = "failed"
        report.longrepr = f"CI=true: this would skip ({reason}); .ci/run must provide what it needs"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    _fail_missing_part_under_ci(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    outcome = yield  # a module that skips as a whole (pytest.skip(allow_module_level=True)) reports here
    _fail_missing_part_under_ci(outcome.get_result())


@pytest.fixture(scope="session", autouse=True)
def _no_session_outlives_the_suite(django_db_setup):
    """Before the test database is dropped: stop what the process itself keeps open (coalescers, lease
    keepers), then name any other session still connected to it and end it, so that a leak is reported
    on stderr (what it ran last) instead of failing the drop with ObjectInUse."""
    yield
    from journal import coalesce
    from journal.flows import event_listener

    coalesce.close_shared()
    event_listener.close_shared()
    if connection.vendor != "postgresql":
        return
    import psycopg

    s = connection.settings_dict
    try:
        psycopg.connect(host=s["HOST"] or "127.0.0.1", port=s["PORT"] or 5432, dbname=s["NAME"],
                        user=s["USER"] or "postgres", password=s["PASSWORD"] or None, connect_timeout=5).close()
    except psycopg.OperationalError:
        return  # no test of this run used the database (it was never created): nothing can be connected
    with psycopg.connect(host=s["HOST"] or "127.0.0.1", port=s["PORT"] or 5432, dbname=s["NAME"],
                         user=s["USER"] or "postgres", password=s["PASSWORD"] or None, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid, state, left(query, 200), pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()").fetchall()
    for pid, state, query, _ in rows:
        sys.stderr.write(f"\nconftest: session {pid} ({state}) still connected at the end, ended; last: {query}\n")


@pytest.fixture(autouse=True)
def _close_shared_coalescers():
    """LOOM_COALESCE is on by default: appends of a test's threads that piled up started the process's
    coalescer, whose flush threads keep their connections; close it after each test so that none
    outlives its test (the test database is flushed between tests and dropped at the end)."""
    yield
    from journal import coalesce

    coalesce.close_shared()


@pytest.fixture(autouse=True)
def _close_get_event_listeners():
    """A get_event on PostgreSQL starts the process's listener of its alias (one LISTEN session, closed
    after some idle seconds); close it after each test so that none outlives its test."""
    yield
    from journal.flows import event_listener

    event_listener.close_shared()


@pytest.fixture
def child_env(settings) -> dict[str, str]:
    """Environment for a child process that must use this test's database and LOOM_* settings."""
    env = dict(os.environ)
    env["DATABASE_URL"] = database_url()
    env["DJANGO_SETTINGS_MODULE"] = "loomsite.settings"
    env["PYTHONPATH"] = str(ROOT)
    # The test's own key, given explicitly: workers spawned by a test verify the tasks it signs (loomsite.E003
    # refuses a key a worker would generate for itself).
    env["SECRET_KEY"] = settings.SECRET_KEY
    for name in dir(settings):
        if name.startswith("LOOM_"):
            value = getattr(settings, name)
            env[name] = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    return env


def run_child(code: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    """Run Python code in a fresh interpreter with Django set up; raise with its output on failure."""
    prelude = "import django; django.setup()\n"
    proc = subprocess.run([sys.executable, "-c", prelude + code], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def spawn_child(code: str, env: dict[str, str]) -> subprocess.Popen:
    """Start Python code in a fresh interpreter with Django set up, without waiting."""
    prelude = "import django; django.setup()\n"
    return subprocess.Popen([sys.executable, "-c", prelude + code], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture
def effects():
    """The side-effect table of the fixture flows, created with raw SQL."""
    key = "id INTEGER PRIMARY KEY AUTOINCREMENT" if connection.vendor == "sqlite" else "id serial PRIMARY KEY"
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE IF NOT EXISTS {EFFECTS_TABLE} ({key}, execution_id varchar(200),"
                       " step varchar(100))")
        cursor.execute(f"DELETE FROM {EFFECTS_TABLE}")
    yield
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {EFFECTS_TABLE}")


def effect_rows() -> list[tuple[str, str]]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT execution_id, step FROM {EFFECTS_TABLE} ORDER BY id")
        return [tuple(r) for r in cursor.fetchall()]
