"""pg-restart: PostgreSQL restarted under load (`pg_ctlcluster VERSION NAME restart`) while producers
append, a process starts durable flows, and a `loom_worker` drains projections and recovers flows.

Only with `--restart-cluster VERSION/NAME` naming the cluster the database is on (never a shared
one), as root, with pg_ctlcluster installed; otherwise the scenario is skipped with the reason.
Producers and the flow starter reconnect after an error (their appends and starts in flight at
the restart are in doubt: neither counted as acknowledged nor expected). The worker gets no help:
its lease keeper, recovery sweep, drains and LISTEN connection must come back by themselves.

Invariants: seqs contiguous; every acknowledged append stored; every execution that exists
completes with each step's effect once; each projection applied every event exactly once (the
reaction at least once); no lease or claim left, and the worker still alive."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path

from django.db import connection, connections

from benchmarks.faults.base import Round, Verdict, acks, drained, finish, settle, streams_of
from benchmarks.faults.processes import wait_until
from journal.models import Execution

NAME = "pg-restart"
POSTGRES_ONLY = True
STREAMS = 3


def _cluster_port(version: str, name: str) -> int | None:
    conf = Path("/etc/postgresql") / version / name / "postgresql.conf"
    if not conf.exists():
        return None
    for line in conf.read_text().splitlines():
        words = line.split("#", 1)[0].replace("=", " ").split()
        if len(words) >= 2 and words[0] == "port":
            return int(words[1])
    return None


def cannot_run(options: dict) -> str | None:
    """Why this machine cannot restart the database under test, or None."""
    target = options.get("restart_cluster")
    if not target:
        return "give --restart-cluster VERSION/NAME (a cluster of its own: the database is restarted)"
    if connection.vendor != "postgresql":
        return "needs PostgreSQL"
    if shutil.which("pg_ctlcluster") is None:
        return "pg_ctlcluster is not installed"
    if os.geteuid() != 0:
        return "must run as root to restart the cluster"
    version, _, name = target.partition("/")
    port = _cluster_port(version, name)
    if port is None:
        return f"no cluster {target} (/etc/postgresql/{version}/{name}/postgresql.conf)"
    if int(connection.settings_dict.get("PORT") or 5432) != port:
        return f"cluster {target} listens on {port}, but the database is on port {connection.settings_dict.get('PORT')}"
    return None


def restart(target: str) -> float:
    version, _, name = target.partition("/")
    t0 = time.monotonic()
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, name, "restart"], check=True,
                   capture_output=True, text=True, timeout=120)
    return time.monotonic() - t0


def _reconnect() -> None:
    for conn in connections.all(initialized_only=True):
        with contextlib.suppress(Exception):
            conn.close()


def run(r: Round) -> Verdict:
    producers, n, steps = 2, r.opt("executions"), r.opt("steps")
    rounds = max(10, r.opt("events") // STREAMS)
    restart_at = r.rng.randint(rounds // 4, rounds // 2) * STREAMS
    ids = [f"{r.prefix}x{i}" for i in range(n)]
    r.params.update(producers=producers, appends=producers * STREAMS * rounds, executions=n, steps=steps,
                    restart_after_appends=restart_at)
    verdict = r.verdict
    with r.pool() as pool:
        env = r.env()
        worker = pool.worker("worker", f"{r.prefix}worker", env)
        writers = [pool.role(f"produce-{w}", "produce", {
            "wid": f"w{w}", "streams": streams_of(r, f"w{w}", STREAMS), "rounds": rounds, "per": 1,
            "pause": 0.03, "tolerant": True}, env) for w in range(producers)]
        starter = pool.role("starter", "flows", {"wid": f"{r.prefix}starter", "ids": ids, "flow": "faults.steps",
                                                 "input": {"n": steps, "pause": 0.05}, "threads": 2, "pause": 0.1,
                                                 "tolerant": True}, env)
        worker.ready()
        wait_until(lambda: starter.said("READY"), "the flow starter to come up", 120, [*writers, starter])
        wait_until(lambda: len(acks(writers[:1])) >= restart_at, "the load to build up", 600, [*writers, starter])
        r.figures["restart_seconds"] = round(restart(r.options["restart_cluster"]), 2)
        _reconnect()
        finish([*writers, starter], 600)
        t0 = time.monotonic()
        existing = list(Execution.objects.filter(id__in=ids).values_list("id", flat=True))
        caught_up = settle(lambda: drained(r.prefix, 3) and Execution.objects.filter(
            id__in=existing, status="completed").count() == len(existing), r.bound)
        r.figures["settled_seconds"] = round(time.monotonic() - t0, 2)
        verdict.add("stuck", "stuck:worker-died", int(not worker.alive()))
        if worker.alive():
            worker.terminate(60)
    verdict.journal(r.prefix, acks(writers))
    verdict.projections(r.prefix, exact=("faults-each", "faults-batch"), loose=("faults-loose",))
    verdict.executions(r.prefix, existing, steps)
    verdict.note("appends-in-doubt", sum(len(w.said("DOUBT")) for w in writers))
    verdict.note("starts-in-doubt", len(starter.said("ERROR")))
    if not caught_up:
        verdict.note("did-not-settle", 1)
    return verdict
