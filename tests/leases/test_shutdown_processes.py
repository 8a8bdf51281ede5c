"""Graceful shutdown with real `loom_worker` processes on PostgreSQL: SIGTERM lets the running steps finish
(LOOM_SHUTDOWN_GRACE), records them, and hands every lease back so another worker continues at once.

The lease TTL is 120 s and every wait below is bounded well under it: an execution that had to wait for a
lease to expire could not finish in time."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from journal.flows import events as ev
from journal.models import Event, Execution
from queues import declare_queue, enqueue
from tests.conftest import ROOT
from tests.fixtures.shutdown_flows import create_effects_table, effect_counts
from tests.leases.test_worker_processes import cleanup, output, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

QUEUE = "t-shutdown"
TTL = 120.0


@pytest.fixture(autouse=True, scope="module")
def stop_the_process_lease_keeper():
    yield
    from leases.keeper import get_keeper, reset_keeper

    get_keeper().shutdown()
    reset_keeper(None)


def worker_env(child_env: dict, tmp_path: Path) -> dict:
    """The workers' settings: a TTL longer than any test, fast renewals and sweeps, the default
    LOOM_RECOVERY_MAX_ATTEMPTS (a takeover of a handed-back lease is no recovery attempt)."""
    child_env.pop("LOOM_RECOVERY_MAX_ATTEMPTS", None)
    child_env.update({
        "LOOM_LEASE_TTL": str(TTL), "LOOM_LEASE_RENEW_EVERY": "0.5", "LOOM_LEASE_LAZY_GRACE": "0.2",
        "LOOM_RECOVERY_EVERY": "0.2", "LOOM_SHUTDOWN_GRACE": "20",
        "LOOM_FLOW_MODULES": "tests.fixtures.shutdown_flows", "LOOM_LEASE_MODE": "lazy",
        "LOOM_QUEUES": json.dumps({QUEUE: {"concurrency": 50}}), "LOOM_QUEUE_THREADS": "2",
        "LOOM_QUEUE_POLL": "0.05", "LOOM_TEST_LOGS": str(tmp_path), "PYTHONFAULTHANDLER": "1",
    })
    return child_env


@pytest.fixture
def env(child_env, tmp_path):
    return worker_env(child_env, tmp_path)


def spawn(env: dict, worker_id: str, *extra: str) -> subprocess.Popen:
    log = open(Path(env["LOOM_TEST_LOGS"]) / f"{worker_id}-{uuid.uuid4().hex[:6]}.log", "w")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "manage.py", "loom_worker", "--id", worker_id, *extra], env=env,
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    proc.log = log
    return proc


def terminate(proc: subprocess.Popen, timeout: float = 60.0) -> int:
    """SIGTERM to the main process only (what a deploy sends); its exit code."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)  # PYTHONFAULTHANDLER: every thread's stack in the log
        proc.wait()
        raise AssertionError(f"the worker did not stop on SIGTERM:\n{output(proc)}") from None


def running_on(prefix: str, worker_id: str) -> bool:
    from leases.models import Lease

    return Lease.objects.filter(execution_id__id__startswith=prefix, owner=worker_id).exists()


def test_a_rolling_restart_runs_no_step_twice_loses_none_and_hands_leases_back(env):
    """3 workers under load (30 flows of 4 steps of 0.6 s, each step's effect committed as it begins); each
    worker in turn gets SIGTERM while it runs steps, exits 0 and is restarted. Every step's effect happened
    once, every execution completed, each position was started once, and every takeover was of a lease a
    stopping worker handed back (none waited for an expiry: the TTL is longer than the whole test)."""
    create_effects_table()
    prefix = f"roll-{uuid.uuid4().hex[:6]}-"
    declare_queue(QUEUE, concurrency=50)
    steps, ids = 4, []

    def more(count: int) -> None:  # the load goes on through the restarts
        for _ in range(count):
            ids.append(enqueue("shutdown.steps", {"n": steps, "pause": 0.6}, queue=QUEUE,
                               execution_id=f"{prefix}{len(ids):02}").execution_id)

    more(12)
    names = [f"rw{i}" for i in range(3)]
    procs = {name: spawn(env, name, "--no-cluster") for name in names}
    every = list(procs.values())
    try:
        for name in names:
            more(6)
            wait_until(lambda name=name: running_on(prefix, name), f"{name} runs a step", timeout=60,
                       proc=procs[name])
            assert terminate(procs[name]) == 0, output(procs[name])
            procs[name] = spawn(env, name, "--no-cluster")
            every.append(procs[name])
        n = len(ids)
        wait_until(lambda: Execution.objects.filter(pk__in=ids, status="completed").count() == n,
                   "every execution completed", timeout=TTL * 0.6)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                terminate(proc)
        logs = "\n".join(output(proc) for proc in every)
        for proc in every:
            cleanup(proc)
    counts = effect_counts(prefix)
    twice = {key: c for key, c in counts.items() if c != 1}
    assert not twice, f"steps whose effect happened more than once: {twice}"
    assert len(counts) == n * steps, "lost steps"
    for eid in ids:
        started = [e.payload["pos"] for e in Event.objects.read(eid) if e.type == ev.STEP_STARTED]
        assert started == list(range(steps)), (eid, started)
    handed = set(re.findall(r"lease handed back execution=(\S+)", logs))
    taken = set(re.findall(r"takeover execution=(\S+)", logs))
    assert handed, "no worker handed a lease back"
    assert taken <= handed, f"taken over without a hand-back: {taken - handed}"


def test_sigterm_during_a_one_step_django_task_lets_it_finish_and_exits_0(env):
    """A Django task (queues.tasks.LoomBackend) of one 3 s step runs in a worker with its django-q2 cluster;
    SIGTERM while it runs: the task finishes there (SUCCESSFUL, its effect once) and the worker exits 0."""
    from tests.fixtures.shutdown_flows import slow_effect

    create_effects_table()
    key = f"task-{uuid.uuid4().hex[:8]}"
    result = slow_effect.enqueue(key, 3.0)
    proc = spawn(env, "tw-grace")
    try:
        wait_until(lambda: effect_counts(key), "the task runs", timeout=60, proc=proc)
        code = terminate(proc)
        log = output(proc)
    finally:
        cleanup(proc)
    assert code == 0, log
    got = slow_effect.get_result(result.id)
    assert got.status.name == "SUCCESSFUL", (got.status, log)
    assert got.return_value == key
    assert effect_counts(key) == {(key, "task"): 1}


def test_a_django_q2_child_drains_by_the_same_rule(env):
    """A queued start (leases.tasks.enqueue_start) runs in a django-q2 child of worker A; SIGTERM to A's main
    process while its first step runs: the child finishes that step, records it and hands the lease back; A
    exits 0. Worker B then continues from the second step at once (the TTL is 120 s): each step once."""
    from leases.tasks import enqueue_start

    create_effects_table()
    eid = f"qchild-{uuid.uuid4().hex[:6]}"
    child_env = {**env, "LOOM_Q_WORKERS": "1"}
    a = spawn(child_env, "qa")
    b = None
    try:
        wait_until(lambda: "django-q2 child ready" in output(a), "A's cluster runs", timeout=60, proc=a)
        enqueue_start("shutdown.steps", {"n": 3, "pause": 1.5}, execution_id=eid)
        wait_until(lambda: effect_counts(eid), "the child runs the first step", timeout=60, proc=a)
        assert terminate(a) == 0, output(a)
        log_a = output(a)
        assert Execution.objects.get(pk=eid).status == "running"
        b = spawn(env, "qb", "--no-cluster")
        wait_until(lambda: Execution.objects.filter(pk=eid, status="completed").exists(), "B continues",
                   timeout=TTL * 0.5, proc=b)
    finally:
        cleanup(a)
        if b is not None:
            cleanup(b)
    assert f"lease handed back execution={eid}" in log_a, log_a
    assert effect_counts(eid) == {(eid, "s0"): 1, (eid, "s1"): 1, (eid, "s2"): 1}
    started = [e.payload["pos"] for e in Event.objects.read(eid) if e.type == ev.STEP_STARTED]
    assert started == [0, 1, 2], started
