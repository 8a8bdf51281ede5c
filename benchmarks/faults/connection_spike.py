"""connection-spike: parked flows fall due while every connection of the server is taken (`FATAL: sorry, too many
clients already`), on a PostgreSQL server of its own with a small max_connections (scripts/spike-server: port
5505, max_connections=30; `--spike-port`): never the shared one, whose other users would be refused too.

The round makes a database of its own on that server (migrated by a child), starts flows that park on a short
sleep, runs a `loom_worker` with LOOM_RECOVERY_MAX_ATTEMPTS=2, then holds every spare connection for `HOLD`
seconds while the flows wake, and lets go. Before issue 35 each woken run failed at its first statement, the
sweep took it over and counted an attempt although no step ran, and flows ended `stuck` for good (47 of 64).

Invariants: every flow completed (0 stuck) once the connections are back, its effect once (0 lost, 0 doubled);
no lease left; the worker alive. Skipped, with the reason, without such a server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from django.db import connection

from benchmarks.faults.base import Round, Verdict
from benchmarks.faults.fixtures import EFFECTS
from benchmarks.faults.processes import ROOT, wait_until

NAME = "connection-spike"
POSTGRES_ONLY = True
DB = "loom_faults_spike"
HOLD = 15.0  # seconds every spare connection is held
SECONDS = 3.0  # the flows' sleep: they fall due inside the hold


def _port(options: dict) -> int:
    return int(options.get("spike_port") or os.environ.get("SPIKE_PORT") or 5505)


def _connect(port: int, dbname: str = "postgres", **kwargs):
    import psycopg

    return psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname=dbname, connect_timeout=3, **kwargs)


def cannot_run(options: dict) -> str | None:
    """Why there is no small server of its own to fill, or None."""
    if connection.vendor != "postgresql":
        return "needs PostgreSQL"
    port = _port(options)
    try:
        with _connect(port, autocommit=True) as conn:
            limit = int(conn.execute("SHOW max_connections").fetchone()[0])
    except Exception as exc:
        return f"no spike server on port {port} (scripts/spike-server starts one, as root): {type(exc).__name__}"
    if limit > 40:
        return f"the server on port {port} allows {limit} connections: not a small one (scripts/spike-server)"
    return None


def hold_every_spare_connection(port: int) -> list:
    """Sessions opened until the server refuses one: nobody gets a new connection while they are held."""
    import psycopg

    held = []
    while len(held) < 500:
        try:
            held.append(_connect(port))
        except psycopg.OperationalError as exc:
            if "too many clients" not in str(exc) and "remaining connection slots" not in str(exc):
                raise
            return held
    raise AssertionError(f"the server on port {port} never refused a connection")


def _recreate(port: int) -> None:
    with _connect(port, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", [DB])
        conn.execute(f"DROP DATABASE IF EXISTS {DB}")
        conn.execute(f"CREATE DATABASE {DB}")


def _drop(port: int) -> None:
    with _connect(port, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", [DB])
        conn.execute(f"DROP DATABASE IF EXISTS {DB}")


SETTLED = ("completed", "failed", "stuck", "cancelled")
STATE = """import django, json, sys; django.setup()
from journal.models import Execution
from leases.store import store_for
prefix = sys.argv[1]
print(json.dumps({"status": dict(Execution.objects.filter(id__startswith=prefix).values_list("id", "status")),
                  "leases": store_for().count_leases(prefix)}))
"""


def _state(env: dict, prefix: str) -> dict:
    """The round's execution statuses and leases left, read on the spike database by a child (through the apps'
    models and stores: this process's Django is on the suite's own database)."""
    out = subprocess.run([sys.executable, "-c", STATE, prefix], env=env, cwd=ROOT, check=True, timeout=120,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def run(r: Round) -> Verdict:
    port, n = _port(r.options), 8 * r.opt("executions")
    r.params.update(flows=n, hold_seconds=HOLD, port=port)
    verdict = r.verdict
    ids = [f"{r.prefix}n{i:03d}" for i in range(n)]
    _recreate(port)
    env = r.env(DATABASE_URL=f"postgres://postgres@127.0.0.1:{port}/{DB}", LOOM_RECOVERY_MAX_ATTEMPTS="2",
                LOOM_LEASE_TTL="1.0", LOOM_LEASE_RENEW_EVERY="0.2", LOOM_RECOVERY_EVERY="0.2",
                LOOM_WAIT_INLINE_MAX="0.5", LOOM_WAIT_POLL="0.2", LOOM_RECOVERY_PATIENCE="120")
    try:
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], env=env, cwd=ROOT, check=True, timeout=600,
                       capture_output=True)
        subprocess.run([sys.executable, "-c", "import django; django.setup()\n"
                        "from benchmarks.faults.fixtures import create_tables; create_tables()"],
                       env=env, cwd=ROOT, check=True, timeout=120, capture_output=True)
        with r.pool() as pool:
            worker = pool.worker("worker", f"{r.prefix}worker", env)
            worker.ready()
            time.sleep(1.0)  # its services opened their sessions
            starter = pool.role("starter", "flows", {"wid": f"{r.prefix}starter", "ids": ids, "flow": "faults.napper",
                                                     "input": {"seconds": SECONDS}, "threads": 2}, env)
            if starter.wait(120) != 0:
                raise AssertionError(f"the starter failed:\n{starter.tail()}")
            held = hold_every_spare_connection(port)
            r.figures["held_connections"] = len(held)
            try:
                time.sleep(HOLD)
            finally:
                for conn in held:
                    conn.close()

            def settled() -> bool:
                state = _state(env, r.prefix)
                return sum(1 for s in state["status"].values() if s in SETTLED) == n

            t0 = time.monotonic()
            wait_until(settled, "every flow to settle", r.bound + 60, [worker])
            r.figures["settled_seconds"] = round(time.monotonic() - t0, 2)
            verdict.add("stuck", "stuck:worker-died", int(not worker.alive()))
            worker.terminate(60)
        state = _state(env, r.prefix)
        status, leases = state["status"], state["leases"]
        with _connect(port, DB) as conn:  # the fault suite's own table
            effects = dict(conn.execute(f"SELECT execution_id, count(*) FROM {EFFECTS} WHERE execution_id LIKE %s "
                                        "GROUP BY execution_id", [r.prefix + "%"]).fetchall())
        verdict.add("stuck", "stuck:not-completed", sum(1 for i in ids if status.get(i) != "completed"))
        verdict.add("stuck", "stuck:marked-stuck", sum(1 for i in ids if status.get(i) == "stuck"))
        verdict.add("lost", "lost:completed-without-effect",
                    sum(1 for i in ids if status.get(i) == "completed" and not effects.get(i)))
        verdict.add("duplicated", "duplicated:effects", sum(n - 1 for n in effects.values() if n > 1))
        verdict.add("stuck", "stuck:leases-left", leases)
        verdict.note("executions", n)
        verdict.note("completed", sum(1 for i in ids if status.get(i) == "completed"))
    finally:
        _drop(port)
    return verdict
