"""One real failover of the pg_auto_failover formation (`scripts/ha-servers`: its primary's keeper and
postmaster SIGKILLed, the synchronous standby promoted) under appends, flows, a queue and drains, through the
fault suite's `failover` scenario (docs/reliability.md), which must find nothing lost, doubled or stuck. A
process scenario: the Django 5.2 legs leave it out (.ci/run), as the other `*_processes.py` modules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.faults import ha
from tests.leases.test_failover import formation_or_skip, node

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.postgres
def test_a_real_failover_loses_nothing_runs_every_queued_entry_once_and_holds_no_lease_past_a_ttl(tmp_path):
    """One failover (the fault scenario at its smallest): acknowledged appends on the new primary, every
    execution started or queued (some claimed when the primary died) completed with each step once, each event
    projected once by drains whose LISTEN sessions died with the primary, no lease expired past a TTL."""
    formation_or_skip()
    db = "loom_failover_test"
    with node(ha.primary_port()) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [db]).fetchone():
            conn.execute(f"CREATE DATABASE {db}")
    env = {**os.environ, "DATABASE_URL": ha.uri(db), "ALLOW_DEV_SECRET_KEY": "true"}
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "--noinput", "-v0", "--skip-checks"], cwd=ROOT, env=env, check=True,
                   timeout=300)
    # The lost node rejoins in the background (scripts/ha-servers start; ~30 s of crash recovery and pg_rewind
    # here): the round's checks do not need it, and the next user of the formation waits for it (ha.problem).
    run = subprocess.run([*manage, "loom_faults", "--skip-checks", "--scenario", "failover", "--failovers", "1",
                          "--repeats", "1", "--failover-rejoin", "background",
                          "--executions", "2", "--steps", "2", "--events", "12", "--bound", "60", "--quiet",
                          "--json", str(tmp_path / "run.json"), "--workdir", str(tmp_path / "w")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads((tmp_path / "run.json").read_text())
    rounds = [r for r in result["results"] if r["scenario"] == "failover"]
    assert len(rounds) == 1, result
    metrics = rounds[0]["metrics"]
    assert (metrics["lost"], metrics["duplicated"], metrics["stuck"]) == (0, 0, 0), metrics
    assert metrics["acknowledged"] > 0 and metrics["executions"] >= 2  # 2 queued, and the starts not in doubt
    assert metrics["promoted_seconds_1"] > 0 and metrics["write_recovery_seconds_1"] >= metrics["promoted_seconds_1"]
