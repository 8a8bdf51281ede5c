"""`manage.py loom_worker` as real processes: a SIGKILLed worker leaves no django-q2 process
behind, and queued starts taken by a worker killed with its whole cluster are finished by a
fresh worker within about a lease TTL, each step's effect once."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from django.utils import timezone
from django_q.models import OrmQ

from journal.models import Execution
from leases.models import Worker
from tests.conftest import ROOT
from tests.fixtures.lease_flows import create_effects_table, effects, queue_old_scheme_start

pytestmark = pytest.mark.django_db(transaction=True)

Q_WORKERS = 2
CLUSTER = Q_WORKERS + 3  # django-q2's sentinel, its workers, monitor and pusher


@pytest.fixture
def env(child_env, settings):
    child_env.update({
        # The workers verify the tasks this process queues: they must share its signing key.
        "SECRET_KEY": settings.SECRET_KEY,
        "LOOM_LEASE_TTL": "1.0", "LOOM_LEASE_RENEW_EVERY": "0.2", "LOOM_LEASE_LAZY_GRACE": "0.2",
        "LOOM_RECOVERY_EVERY": "0.2", "LOOM_FLOW_MODULES": "tests.fixtures.lease_flows", "LOOM_LEASE_MODE": "lazy",
        "LOOM_Q_WORKERS": str(Q_WORKERS), "PYTHONFAULTHANDLER": "1",
    })
    return child_env


def group(pgid: int) -> set[int]:
    """Live (non-zombie) processes of process group `pgid` (loom_worker runs in its own session,
    and django-q2's processes stay in it: they are forked, never setsid)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # state, ppid, pgrp, ...
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found.add(int(entry.name))
    return found


def spawn_worker(env: dict, worker_id: str) -> subprocess.Popen:
    # stdout/stderr to files, not pipes: an unread pipe would block the worker's logging.
    log = open(Path(env["LOOM_TEST_LOGS"]) / f"{worker_id}.log", "w")  # noqa: SIM115 (closed by the caller)
    proc = subprocess.Popen([sys.executable, "manage.py", "loom_worker", "--id", worker_id], env=env, cwd=ROOT,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    proc.log = log
    return proc


def output(proc: subprocess.Popen) -> str:
    proc.log.flush()
    return Path(proc.log.name).read_text()


def wait_until(predicate, what: str, timeout: float = 60.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: the worker exited early ({proc.returncode}):\n{output(proc)}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for: {what}" + (f"\n{output(proc)}" if proc else ""))
        time.sleep(0.05)


def cleanup(proc: subprocess.Popen | None) -> None:
    if proc is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.log.close()


@pytest.fixture
def logs(env, tmp_path):
    env["LOOM_TEST_LOGS"] = str(tmp_path)
    return tmp_path


def test_a_sigkilled_loom_worker_takes_its_django_q2_processes_with_it(env, logs):
    """SIGKILL of loom_worker's main process, at a random moment (during start-up or once its
    cluster runs): every process of its cluster is gone within a few seconds."""
    rng = random.Random()
    for round_ in range(3):
        proc = spawn_worker(env, f"orphan-{round_}")
        try:
            if round_ == 0:  # during start-up: as soon as the cluster began forking
                wait_until(lambda p=proc: len(group(p.pid)) >= 2, "the cluster starts forking", proc=proc)
                time.sleep(rng.uniform(0, 0.3))
            else:  # once every django-q2 process runs
                wait_until(lambda p=proc: len(group(p.pid)) >= 1 + CLUSTER, "the cluster runs", proc=proc)
                time.sleep(rng.uniform(0, 1.5))
            before = group(proc.pid) - {proc.pid}
            assert before, "no django-q2 process to orphan"
            proc.kill()
            proc.wait()
            deadline = time.monotonic() + 15  # generous: the kernel signals at once
            while group(proc.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not group(proc.pid), f"round {round_}: orphans {group(proc.pid)} of {before}\n{output(proc)}"
        finally:
            cleanup(proc)


def test_sigterm_to_the_whole_process_group_stops_the_worker(env, logs):
    """systemd's default KillMode=control-group (and `kill -- -PGID`) sends SIGTERM to loom_worker and to every
    django-q2 process at once, at a random moment once the cluster runs: the main process still stops, exit 0,
    and leaves nothing behind. Before, it hung for ever in a multiprocessing Event's set(), which waits for every
    process sleeping in that event's wait() to wake, and the killed sentinel never did."""
    rng = random.Random()
    for round_ in range(2):
        proc = spawn_worker(env, f"group-term-{round_}")
        try:
            wait_until(lambda p=proc: "SIGTERM stops it" in output(p) and len(group(p.pid)) >= 1 + CLUSTER,
                       "the worker and its cluster run", proc=proc)
            time.sleep(rng.uniform(0, 1.0))
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                code = proc.wait(60)  # a hang bound, not a timing: the stop takes a few seconds
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGABRT)  # PYTHONFAULTHANDLER: every thread's stack in the log
                proc.wait()
                raise AssertionError(f"round {round_}: the worker hung after SIGTERM to its group:\n"
                                     f"{output(proc)}") from None
            assert code == 0, output(proc)
            assert f"loom worker group-term-{round_} stopped" in output(proc), output(proc)
            deadline = time.monotonic() + 15
            while group(proc.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not group(proc.pid), f"round {round_}: left {group(proc.pid)}"
        finally:
            cleanup(proc)


@pytest.mark.postgres  # several processes writing the ORM broker's queue and the journal at once
def test_queued_starts_of_a_killed_worker_finish_on_a_fresh_worker_within_about_a_ttl(env, logs):
    """Starts queued through django-q2's ORM broker under the old scheme (before issue #24), delivered to a
    worker's cluster (each routed into the queue) and run by its dispatcher, which is then SIGKILLed with
    its whole cluster: a fresh worker finishes every one (begun ones by recovery, queued ones by its
    dispatcher, tasks only taken by re-delivery after Q_CLUSTER retry = TTL + 5 s), each step's effect
    exactly once, and no django-q2 queue row is left."""
    create_effects_table()
    tag = uuid.uuid4().hex[:8]
    n, steps = 10, 4
    victim = spawn_worker(env, f"victim-{tag}")
    rescuer = None
    try:
        wait_until(lambda: Worker.objects.filter(id=f"victim-{tag}").exists()
                   and len(group(victim.pid)) >= 1 + CLUSTER, "the victim runs", proc=victim)
        # The workers page: one row for the main process, one per django-q2 worker process.
        wait_until(lambda: Worker.objects.filter(id__startswith=f"victim-{tag}/", role="django-q2 child").count()
                   == Q_WORKERS, "the django-q2 children register", proc=victim)
        assert Worker.objects.get(id=f"victim-{tag}").role == "main"
        eids = [f"q-{tag}-{i}" for i in range(n)]
        for eid in eids:
            queue_old_scheme_start("leases.steps", {"n": steps, "pause": 0.3}, eid)
        mine = lambda: [e for e in effects() if e[0].startswith(f"q-{tag}")]  # noqa: E731
        # Killed once it runs starts.
        wait_until(lambda: len(mine()) >= 2, "the victim takes the starts", proc=victim)
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait()
        begun = set(Execution.objects.filter(id__in=eids).exclude(status="queued").values_list("id", flat=True))
        assert begun and len(begun) < n, begun  # killed with starts both begun and only taken
        rescuer = spawn_worker(env, f"rescuer-{tag}")
        # Bound: TTL (1 s) + re-delivery (retry 6 s) + the runs, with generous slack for a loaded
        # machine; the broker's former retry (360 s) could not meet it.
        wait_until(lambda: Execution.objects.filter(id__in=eids, status="completed").count() == n,
                   "the rescuer finishes every start", timeout=90, proc=rescuer)
        assert sorted(mine()) == sorted((eid, f"s{i:03d}") for eid in eids for i in range(steps))
        wait_until(lambda: not OrmQ.objects.exists(), "every queue row acknowledged", timeout=60, proc=rescuer)
        rescuer.send_signal(signal.SIGTERM)
        assert rescuer.wait(60) == 0, output(rescuer)
        rows = Worker.objects.filter(id__startswith=f"rescuer-{tag}")
        assert {w.role for w in rows} == {"main", "django-q2 child"}
        # The main row is marked stopped on SIGTERM. A django-q2 child marks its row only when it leaves by
        # itself; one the cluster terminates on shutdown does not (its row then reads "gone"). That no
        # process is left is asserted below.
        assert rows.get(role="main").stopped_at is not None
        assert rows.count() >= 1 + Q_WORKERS
        logged = output(victim) + output(rescuer)  # the worker's own log lines (docs/workers.md "Logs")
        for line in (f"old-scheme start execution=q-{tag}-", f"completed execution=q-{tag}-",
                     f"takeover execution=q-{tag}-", f"recovered execution=q-{tag}-"):
            assert line in logged, line
        assert not group(rescuer.pid)
    finally:
        cleanup(victim)
        cleanup(rescuer)


def time_now():
    return timezone.now()
