"""Leases across real processes on PostgreSQL: a paused owner is fenced off, a killed owner's
executions are recovered exactly once per step, racing lazy starts leave no trace of the loser,
and `manage.py loom_worker` stops cleanly on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from journal.flows import events as ev
from journal.models import Event, Execution
from leases.models import Lease, Worker
from tests.conftest import ROOT, spawn_child
from tests.fixtures.lease_flows import create_effects_table, effects

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def env(child_env):
    child_env.update({
        "LOOM_LEASE_TTL": "1.0", "LOOM_LEASE_RENEW_EVERY": "0.2", "LOOM_LEASE_LAZY_GRACE": "0.2",
        "LOOM_RECOVERY_EVERY": "0.2", "LOOM_FLOW_MODULES": "tests.fixtures.lease_flows", "LOOM_LEASE_MODE": "lazy",
        "PYTHONFAULTHANDLER": "1",
    })
    return child_env


def wait_until(predicate, what: str, timeout: float = 45.0, procs=()) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        for proc in procs:
            if proc.poll() is not None:
                out, err = proc.communicate()
                raise AssertionError(f"{what}: a child exited early ({proc.returncode}):\n{out}\n{err}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for: {what}")
        time.sleep(0.05)


def loom_worker(env: dict, worker_id: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "manage.py", "loom_worker", "--no-cluster", "--id", worker_id],
                            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def stop(proc: subprocess.Popen) -> tuple[int, str, str]:
    proc.send_signal(signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)  # PYTHONFAULTHANDLER: every thread's stack goes to stderr
        out, err = proc.communicate()
        raise AssertionError(f"the worker did not stop on SIGTERM:\n{out}\n{err}") from None
    return proc.returncode, out, err


# Worker A: only the heartbeat (no recovery of its own), runs one execution, then tries a late
# append with its old token and reports what happened.
HOLDER = """
from journal.envelopes import Envelope
from journal.exceptions import StaleFence
from journal.flows import start
from journal.models import Event
from leases.worker import HeartbeatService, Worker
w = Worker("A", services=[HeartbeatService])
w.start()
try:
    print("OUTCOME", start("leases.gated", {args!r}, execution_id={eid!r}).status, flush=True)
except Exception as exc:
    print("HALTED", type(exc).__name__, flush=True)
try:
    Event.objects.append({eid!r}, Envelope("LATE_WRITE"), fence_token=1)
    print("APPENDED", flush=True)
except StaleFence:
    print("REFUSED", flush=True)
w.stop(5)
"""


def test_a_paused_owner_is_taken_over_and_its_late_append_is_refused(env, tmp_path):
    """A holds an execution; SIGSTOP past the TTL; B takes over and finishes; SIGCONT: A is refused."""
    eid = f"pause-{uuid.uuid4().hex[:8]}"
    args = {"marker": str(tmp_path / "running"), "release": str(tmp_path / "release")}
    env_a = {**env, "LOOM_LEASE_MODE": "eager"}
    a = spawn_child(HOLDER.format(args=args, eid=eid), env_a)
    b = None
    try:
        wait_until(lambda: (tmp_path / f"running.{a.pid}").exists()
                   and Lease.objects.filter(execution_id=eid, owner="A").exists(), "A runs and holds", procs=[a])
        a.send_signal(signal.SIGSTOP)
        b = loom_worker(env, "B")
        wait_until(lambda: Lease.objects.filter(execution_id=eid, owner="B").exists(), "B takes over", procs=[b])
        wait_until(lambda: (tmp_path / f"running.{b.pid}").exists(), "B runs the step", procs=[b])
        (tmp_path / "release").write_text("go")
        wait_until(lambda: Execution.objects.filter(id=eid, status="completed").exists(), "B finishes", procs=[b])
        a.send_signal(signal.SIGCONT)
        out, err = a.communicate(timeout=30)
        assert "HALTED OwnershipLost" in out and "REFUSED" in out, (out, err)
        events = Event.objects.read(eid)
        assert "LATE_WRITE" not in [e.type for e in events]
        completions = [e for e in events if e.type == ev.STEP_COMPLETED and e.payload["step"] == "wait"]
        assert [c.payload["result"] for c in completions] == [b.pid]  # B's run, and only B's, completed it
        assert Execution.objects.get(id=eid).result == b.pid
        assert [e.seq for e in events] == list(range(len(events)))
        code, _, err_b = stop(b)
        b = None
        assert code == 0, err_b
    finally:
        for proc in (a, b):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.communicate()


STARTER = """
import threading
from django.db import connections
from journal.flows import start
from leases.worker import HeartbeatService, Worker
w = Worker("K", services=[HeartbeatService])
w.start()
def run(eid):
    try:
        start("leases.steps", {{"n": {n}, "pause": 0.15}}, execution_id=eid)
    finally:
        connections.close_all()
threads = [threading.Thread(target=run, args=(eid,)) for eid in {eids!r}]
for t in threads: t.start()
for t in threads: t.join()
"""


def test_a_killed_worker_is_recovered_and_every_step_happens_once(env):
    """SIGKILL mid-flow: another worker recovers every execution; each step's effect exists once."""
    create_effects_table()
    tag = uuid.uuid4().hex[:8]
    eids = [f"kill-{tag}-{i}" for i in range(4)]
    n = 8
    victim = spawn_child(STARTER.format(n=n, eids=eids), env)
    rescuer = None
    try:
        mine = lambda: [e for e in effects() if e[0].startswith(f"kill-{tag}")]  # noqa: E731
        wait_until(lambda: len(mine()) >= 10, "the victim makes progress", procs=[victim])
        victim.kill()
        victim.communicate()
        assert len(mine()) < len(eids) * n  # killed mid-flow
        rescuer = loom_worker(env, "R")
        wait_until(lambda: Execution.objects.filter(id__in=eids, status="completed").count() == len(eids),
                   "the rescuer finishes every execution", procs=[rescuer])
        got = mine()
        assert sorted(got) == sorted((eid, f"s{i:03d}") for eid in eids for i in range(n))
        assert all(r >= 1 for r in Execution.objects.filter(id__in=eids).values_list("recoveries", flat=True))
        code, _, err = stop(rescuer)
        rescuer = None
        assert code == 0, err
        assert Worker.objects.get(id="R").stopped_at is not None
        assert not Lease.objects.filter(execution_id__in=eids).exists()
    finally:
        for proc in (victim, rescuer):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate()


RACER = """
import os, time
from journal.flows import ExecutionExists, start
from leases.keeper import get_keeper
go = {go!r}
while not os.path.exists(go):
    time.sleep(0.005)
try:
    print("OUTCOME", start("leases.sleepy", {{"seconds": 0.8}}, execution_id={eid!r}).status, flush=True)
except ExecutionExists:
    print("EXISTS", flush=True)
k = get_keeper()
k.drain()
print("PENDING", len(k.pending), "HELD", len(k.held), "ACQUIRES", k.stats["acquire"], flush=True)
k.shutdown()
"""


def test_racing_lazy_starts_of_one_id_leave_no_lease_for_the_loser(env, tmp_path):
    """Two processes start the same id lazily: one runs (and leases after the grace); the other is
    refused by the sequence-0 bootstrap before any step, with no grace timer and no lease."""
    eid = f"race-{uuid.uuid4().hex[:8]}"
    go = tmp_path / "go"
    racers = [spawn_child(RACER.format(go=str(go), eid=eid), env) for _ in range(2)]
    try:
        go.write_text("go")
        owners = set()
        while any(r.poll() is None for r in racers):
            owners.update(Lease.objects.filter(execution_id=eid).values_list("owner", flat=True))
            time.sleep(0.05)
        outs = [r.communicate()[0] for r in racers]
    finally:
        for r in racers:
            if r.poll() is None:
                r.kill()
                r.communicate()
    winner = [o for o in outs if "OUTCOME completed" in o]
    loser = [o for o in outs if "EXISTS" in o]
    assert len(winner) == 1 and len(loser) == 1, outs
    assert "PENDING 0 HELD 0 ACQUIRES 0" in loser[0]
    assert "ACQUIRES 1" in winner[0]  # the 0.8 s run outlived the 0.2 s grace
    winner_pid = racers[outs.index(winner[0])].pid
    assert owners <= {f"{os.uname().nodename}:{winner_pid}"}
    assert Event.objects.read(eid)[0].type == ev.EXECUTION_STARTED
    assert not Lease.objects.filter(execution_id=eid).exists()


def test_loom_worker_runs_queued_executions_through_django_q2_and_stops_on_sigterm(env):
    """`loom_worker` (with its django-q2 cluster) runs a queued start, schedules the recovery
    backstop, and exits 0 on SIGTERM with its worker row marked stopped."""
    from django_q.models import Schedule

    from leases.tasks import SCHEDULE_NAME, enqueue_start

    proc = subprocess.Popen([sys.executable, "manage.py", "loom_worker", "--id", "Q"],
                            env={**env, "LOOM_Q_WORKERS": "1"},
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # its own process group: the cluster's children too
    eid = f"queued-{uuid.uuid4().hex[:8]}"
    try:
        # Started: the cluster made its schedule AND the node registered (its services are up).
        wait_until(lambda: Schedule.objects.filter(name=SCHEDULE_NAME).exists()
                   and Worker.objects.filter(id="Q").exists(), "the worker starts", procs=[proc])
        enqueue_start("leases.noop", {}, execution_id=eid)
        wait_until(lambda: Execution.objects.filter(id=eid, status="completed").exists(), "the queued start runs",
                   procs=[proc])
        code, _, err = stop(proc)
        assert code == 0, err
        assert Worker.objects.get(id="Q").stopped_at is not None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
