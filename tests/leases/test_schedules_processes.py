"""Schedules across real processes on PostgreSQL: four processes ticking one schedule start each tick
exactly once (the claim's SKIP LOCKED), and a real `loom_worker` fires a schedule end to end."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from journal.models import Execution
from leases import schedules as sc
from leases.models import Schedule
from tests.conftest import ROOT, spawn_child
from tests.fixtures import schedule_flows  # noqa: F401

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

TICKER = """
import json, time
from tests.fixtures import schedule_flows
from leases import schedules as sc
from leases.schedules import tick
started = []
until = time.monotonic() + {seconds}
while time.monotonic() < until:
    started += [s.execution_id for s in tick()]
print(json.dumps(started))
"""


def queued_ticks(prefix: str) -> list[str]:
    """The ticks queued on the default queue (issue #24: a tick without a queue of its own is a queued
    execution there, no longer a django-q2 task), by execution id."""
    from queues.models import QueueEntry

    return sorted(QueueEntry.objects.filter(queue_id="default", execution_id__startswith=prefix)
                  .values_list("execution_id", flat=True))


def test_four_processes_racing_start_every_tick_exactly_once(child_env):
    """An every-second schedule 20 s behind (catch_up=all) and still ticking: four processes tick it
    for 2 s. Each tick is started by exactly one process, none is lost, one queued start per tick."""
    sc.define("proc-race", "* * * * * *", "sched.echo", {"n": 1}, catch_up="all")
    Schedule.objects.filter(pk="proc-race").update(
        next_tick_at=timezone.now().replace(microsecond=0) - timedelta(seconds=20))
    procs = [spawn_child(TICKER.format(seconds=2), child_env) for _ in range(4)]
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        outputs.append(json.loads(out.strip().splitlines()[-1]))
    ids = [eid for out in outputs for eid in out]
    assert len(ids) == len(set(ids)) >= 20
    ticks = sorted(ids)
    seconds = [int(eid[-3:-1]) for eid in ticks]  # ...:SSZ, contiguous modulo the minute
    assert all((b - a) % 60 == 1 for a, b in itertools.pairwise(seconds))
    assert queued_ticks("sched:proc-race:") == ticks


def test_a_real_worker_fires_a_schedule_and_its_execution_completes(child_env):
    env = {**child_env, "LOOM_FLOW_MODULES": "tests.fixtures.schedule_flows", "LOOM_Q_WORKERS": "1",
           "LOOM_SCHEDULE_EVERY": "0.2"}
    sc.define("fires", "* * * * * *", "sched.echo", {"hello": "world"})
    proc = subprocess.Popen([sys.executable, "manage.py", "loom_worker", "--id", "sched-worker"], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while not Execution.objects.filter(id__startswith="sched:fires:", status="completed").exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no scheduled execution completed"
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    done = Execution.objects.filter(id__startswith="sched:fires:", status="completed").first()
    assert done.flow == "sched.echo" and done.input == {"hello": "world"} and done.result == {"hello": "world"}


def test_four_loom_workers_start_each_tick_once_even_when_one_is_sigkilled(child_env):
    """Four `loom_worker --no-cluster` processes tick an every-second schedule (every 0.1 s each); one is
    SIGKILLed mid-way. Every second from the first due tick to the last started is started exactly
    once across the workers' logs, and exactly one queued start exists per tick."""
    import re

    env = {**child_env, "LOOM_FLOW_MODULES": "tests.fixtures.schedule_flows", "LOOM_SCHEDULE_EVERY": "0.1"}
    sc.define("w4", "* * * * * *", "sched.echo", {"w": 4}, catch_up="all")
    procs = [subprocess.Popen([sys.executable, "manage.py", "loom_worker", "--no-cluster", "--id", f"w4-{i}"],
                              env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(4)]
    try:
        deadline = time.monotonic() + 90
        while len(queued_ticks("sched:w4:")) < 3:  # the workers are up and ticking
            assert all(p.poll() is None for p in procs) and time.monotonic() < deadline, "workers did not tick"
            time.sleep(0.1)
        procs[0].kill()  # SIGKILL: whatever tick it was in rolls back; the others carry on
        seen = len(queued_ticks("sched:w4:"))
        while len(queued_ticks("sched:w4:")) < seen + 3:
            assert all(p.poll() is None for p in procs[1:]) and time.monotonic() < deadline, "ticks stopped"
            time.sleep(0.1)
    finally:
        for proc in procs[1:]:
            proc.send_signal(signal.SIGTERM)
        logs = [proc.communicate(timeout=60)[1] for proc in procs]
    # A worker logs a start after its commit: an id in two logs would be a tick started twice.
    started = [eid for log in logs for eid in re.findall(r"started execution=(sched:w4:\S+)", log)]
    queued = queued_ticks("sched:w4:")
    assert len(set(started)) == len(started) >= 6 and set(started) <= set(queued)
    assert len(set(queued)) == len(queued)  # one queued start per tick
    seconds = [int(eid[-3:-1]) for eid in queued]
    assert all((b - a) % 60 == 1 for a, b in itertools.pairwise(seconds))  # none lost
