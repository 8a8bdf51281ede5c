"""A connection spike marks no healthy flow stuck (issue #35). On a PostgreSQL server of its own with
max_connections=30 (scripts/spike-server: port 5505), a real loom_worker holds 64 parked flows whose sleeps
fall due while this test holds every spare connection of the server for 15 s. Before the fix, each woken run
failed at its first statement (`FATAL: sorry, too many clients already`), the recovery sweep took it over and
counted an attempt although no step ran, and with LOOM_RECOVERY_MAX_ATTEMPTS=2 flows ended `stuck`, for good.
Now a run that cannot reach the database backs off and tries again under the same fence (not an attempt of the
flow): once the connections are back every flow completes, its effect once, none stuck.

Skipped (one line) when the spike server is not running: `scripts/spike-server` starts it (as root)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.postgres

PORT = int(os.environ.get("SPIKE_PORT", "5505"))
DB = "loom_spike_test"
FLOWS = 64
HOLD = 15.0


def _connect(dbname: str = "postgres", **kwargs):
    import psycopg

    return psycopg.connect(host="127.0.0.1", port=PORT, user="postgres", dbname=dbname, connect_timeout=3, **kwargs)


def _server() -> str | None:
    """Why the spike server cannot be used, or None."""
    try:
        with _connect(autocommit=True) as conn:
            limit = int(conn.execute("SHOW max_connections").fetchone()[0])
    except Exception as exc:  # not running: the test skips with the reason
        return f"no spike server on port {PORT} (run scripts/spike-server as root): {exc}"
    if limit > 40:
        return f"the server on port {PORT} allows {limit} connections: not a small one (scripts/spike-server)"
    return None


def _run(code: str, env: dict, timeout: float = 180) -> str:
    proc = subprocess.run([sys.executable, "-c", "import django; django.setup()\n" + code], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _rows(sql: str) -> list[tuple]:
    with _connect(DB) as conn:
        return conn.execute(sql).fetchall()


def _hold_every_spare_connection() -> list:
    """Open sessions until the server refuses one (too many clients): nobody else gets a new one."""
    import psycopg

    held = []
    while True:
        try:
            held.append(_connect())
        except psycopg.OperationalError as exc:
            assert "too many clients" in str(exc) or "remaining connection slots" in str(exc), exc
            return held
        assert len(held) < 200, "the server never refused a connection"


@pytest.fixture
def spike_env(child_env, tmp_path):
    why = _server()
    if why:
        pytest.skip(why)
    with _connect(autocommit=True) as conn:
        conn.execute(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{DB}'")
        conn.execute(f"DROP DATABASE IF EXISTS {DB}")
        conn.execute(f"CREATE DATABASE {DB}")
    env = dict(child_env)
    env.update({
        "DATABASE_URL": f"postgres://postgres@127.0.0.1:{PORT}/{DB}", "LOOM_FLOW_MODULES": "tests.fixtures.spike_flows",
        "LOOM_LEASE_MODE": "lazy", "LOOM_LEASE_TTL": "1.0", "LOOM_LEASE_RENEW_EVERY": "0.2",
        "LOOM_LEASE_LAZY_GRACE": "0.2", "LOOM_RECOVERY_EVERY": "0.2", "LOOM_RECOVERY_MAX_ATTEMPTS": "2",
        "LOOM_WAIT_INLINE_MAX": "0.5", "LOOM_WAIT_POLL": "0.2", "LOOM_WAIT_BATCH": "16", "LOOM_Q_WORKERS": "1",
        "LOOM_QUEUE_THREADS": "1", "LOOM_RECOVERY_PATIENCE": "120", "LOOM_TEST_LOGS": str(tmp_path),
    })
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], env=env, cwd=ROOT, check=True, timeout=300)
    _run("from tests.fixtures import spike_flows; spike_flows.create_table()", env)
    yield env
    with _connect(autocommit=True) as conn:
        conn.execute(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{DB}'")
        conn.execute(f"DROP DATABASE IF EXISTS {DB}")


def test_waiting_flows_that_wake_during_a_connection_spike_all_complete_none_stuck(spike_env):
    from tests.leases.test_worker_processes import cleanup, output, spawn_worker, wait_until

    worker = spawn_worker(spike_env, "spike-w0")
    held: list = []
    try:
        wait_until(lambda: _rows("SELECT count(*) FROM leases_worker WHERE id = 'spike-w0'")[0][0] == 1,
                   "the worker is up", proc=worker)
        time.sleep(1.0)  # its services opened their sessions
        # Parked now, due a few seconds into the spike: every one wakes while no connection can be had.
        _run("from journal.flows import start\n"
             f"for n in range({FLOWS}):\n"
             "    assert start('spike.sleeper', {'seconds': 3.0}, execution_id=f'sp-{n:03}').status == 'waiting'\n",
             spike_env)
        held = _hold_every_spare_connection()
        time.sleep(HOLD)
        for conn in held:
            conn.close()
        held = []
        wait_until(lambda: _rows("SELECT count(*) FROM journal_execution WHERE id LIKE 'sp-%' "
                                 "AND status IN ('completed', 'failed', 'stuck', 'cancelled')")[0][0] == FLOWS,
                   "every flow settled", timeout=120, proc=worker)
        assert worker.poll() is None, output(worker)
        log = output(worker)
    finally:
        for conn in held:
            conn.close()
        cleanup(worker)
    statuses = dict(_rows("SELECT status, count(*) FROM journal_execution WHERE id LIKE 'sp-%' GROUP BY status"))
    assert statuses == {"completed": FLOWS}, (statuses, log[-4000:])
    effects = _rows("SELECT execution_id, count(*) FROM spike_effects GROUP BY execution_id")
    assert len(effects) == FLOWS and all(n == 1 for _, n in effects), effects
    assert "cannot be reached" in log  # the spike happened to these runs: they waited it out
