"""Operating a deployment with real loom_worker processes on PostgreSQL: a paused queue is not dispatched from
by two workers racing for it (while they go on dispatching another queue), a pending entry of it can still be
cancelled, and its entries all run once it is resumed; a drained worker takes nothing new, lets its running
execution finish (completed, not handed back), and exits by itself."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command
from django.utils import timezone

from journal.models import Execution
from leases.models import DrainRequest, Lease, Worker
from queues import declare_queue, enqueue, pause
from queues.declarations import forget
from queues.models import QueueEntry
from tests.conftest import ROOT
from tests.fixtures import queue_flows  # noqa: F401  (the flows)
from tests.leases.test_worker_processes import cleanup, output, spawn_worker, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

PAUSED, OTHER = "t-ops-paused", "t-ops-other"


@pytest.fixture(autouse=True, scope="module")
def stop_the_process_lease_keeper():
    yield
    from leases.keeper import get_keeper, reset_keeper

    get_keeper().shutdown()
    reset_keeper(None)


@pytest.fixture
def env(child_env, tmp_path):
    child_env.update({
        "LOOM_LEASE_TTL": "2.0", "LOOM_LEASE_RENEW_EVERY": "0.2", "LOOM_RECOVERY_EVERY": "0.2",
        "LOOM_FLOW_MODULES": "tests.fixtures.queue_flows", "LOOM_LEASE_MODE": "eager", "LOOM_QUEUE_THREADS": "2",
        "LOOM_QUEUES": json.dumps({PAUSED: {"concurrency": 4}, OTHER: {"concurrency": 4}}),
        "LOOM_QUEUE_POLL": "0.02", "LOOM_TEST_LOGS": str(tmp_path), "LOOM_DRAIN_POLL": "0.1",
        "LOOM_SHUTDOWN_GRACE": "5",
    })
    return child_env


@pytest.fixture
def queues_declared():
    declare_queue(PAUSED, concurrency=4)
    declare_queue(OTHER, concurrency=4)
    yield
    forget(PAUSED)
    forget(OTHER)


def done(prefix: str) -> int:
    return Execution.objects.filter(pk__startswith=prefix, status="completed").count()


def test_two_racing_workers_never_dispatch_from_a_paused_queue_and_resume_runs_it(env, queues_declared):
    for n in range(16):
        enqueue("queues.test.nap", {"seconds": 0.1}, queue=PAUSED, execution_id=f"op-p-{n:02}")
    workers = [spawn_worker(env, f"opw{n}") for n in range(2)]
    try:
        wait_until(lambda: done("op-p-") >= 2, "the workers are dispatching the queue", proc=workers[0])
        pause.pause(PAUSED, "test")  # while both race for the queue
        claimed = set(QueueEntry.objects.filter(queue_id=PAUSED).exclude(state="pending")
                      .values_list("execution_id", flat=True))
        assert len(claimed) < 16, "the queue drained before the pause: nothing left to prove"
        # Both dispatchers keep working (another queue's entries run on both) while the paused one waits.
        for n in range(8):
            enqueue("queues.test.nap", {"seconds": 0.2}, queue=OTHER, execution_id=f"op-o-{n:02}")
        wait_until(lambda: done("op-o-") == 8, "the other queue ran", proc=workers[1])
        by = set(QueueEntry.objects.filter(queue_id=OTHER).values_list("worker", flat=True))
        assert by == {"opw0", "opw1"}, f"both workers dispatched the other queue: {by}"
        later = set(QueueEntry.objects.filter(queue_id=PAUSED).exclude(state="pending")
                    .values_list("execution_id", flat=True))
        assert later == claimed, f"claimed from the paused queue: {sorted(later - claimed)}"
        # pause x cancel: a pending entry of the paused queue is cancelled as ever; enqueue is still accepted.
        waiting = QueueEntry.objects.filter(queue_id=PAUSED, state="pending").order_by("id").first()
        call_command("loom", "executions", "cancel", waiting.execution_id)
        assert QueueEntry.objects.get(pk=waiting.pk).state == "cancelled"
        enqueue("queues.test.nap", {"seconds": 0.0}, queue=PAUSED, execution_id="op-p-late")
        call_command("loom", "queues", "resume", PAUSED)
        wait_until(lambda: done("op-p-") == 16, "the resumed queue ran every live entry", proc=workers[0])
        assert Execution.objects.get(pk=waiting.execution_id).status == "cancelled"
    finally:
        for worker in workers:
            cleanup(worker)


def spawn(env: dict, worker_id: str):
    """A loom_worker (--no-cluster: the queue dispatcher runs the entries) with a short stop timeout."""
    log = open(Path(env["LOOM_TEST_LOGS"]) / f"{worker_id}.log", "w")  # noqa: SIM115 (closed by cleanup)
    proc = subprocess.Popen([sys.executable, "manage.py", "loom_worker", "--id", worker_id, "--no-cluster",
                             "--stop-timeout", "2"], env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    proc.log = log
    return proc


def test_drained_workers_finish_their_runs_take_nothing_new_and_exit_unless_sigterm_comes_first(env,
                                                                                              queues_declared):
    """Two workers each run one execution (one runner thread each) and are asked to drain. The one with the
    short run lets it complete (not handed back), takes nothing enqueued after, and exits by itself. The other's
    run is a 30 s step: a SIGTERM during its drain is an ordinary graceful shutdown (drain x LOOM_SHUTDOWN_GRACE):
    after the grace the step is interrupted and its lease handed back (expired at once) for another worker."""
    env.update({"LOOM_QUEUE_THREADS": "1", "LOOM_SHUTDOWN_GRACE": "0.5"})
    workers = {wid: spawn(env, wid) for wid in ("opw-a", "opw-b")}
    try:
        wait_until(lambda: Worker.objects.filter(pk__in=list(workers), stopped_at__isnull=True).count() == 2,
                   "both workers registered", proc=workers["opw-a"])
        enqueue("queues.test.nap", {"seconds": 1.5}, queue=OTHER, execution_id="op-d-short")
        enqueue("queues.test.nap", {"seconds": 30}, queue=OTHER, execution_id="op-d-long")
        wait_until(lambda: Execution.objects.filter(pk__in=["op-d-short", "op-d-long"], status="running").count()
                   + Execution.objects.filter(pk="op-d-short", status="completed").count() == 2,
                   "both runs began", proc=workers["opw-b"])
        owner = dict(QueueEntry.objects.filter(queue_id=OTHER).values_list("execution_id", "worker"))
        assert set(owner.values()) == set(workers), f"one run each: {owner}"
        short, long = workers[owner["op-d-short"]], workers[owner["op-d-long"]]
        for wid in workers:
            call_command("loom", "workers", "drain", wid)
        wait_until(lambda: DrainRequest.objects.filter(started_at__isnull=False).count() == 2,
                   "both workers saw their drain request", proc=long)
        enqueue("queues.test.nap", {"seconds": 0.0}, queue=OTHER, execution_id="op-d-after")
        assert short.wait(timeout=60) == 0, output(short)
        run = Execution.objects.get(pk="op-d-short")
        assert run.status == "completed" and run.recoveries == 0, (run.status, output(short))
        assert DrainRequest.objects.get(worker_id=owner["op-d-short"]).finished_at is not None
        assert Worker.objects.get(pk=owner["op-d-short"]).stopped_at is not None
        assert "drained (no run left); exiting" in output(short)
        assert long.poll() is None  # still draining: its 30 s step runs
        long.send_signal(signal.SIGTERM)
        assert long.wait(timeout=60) == 0, output(long)
        lease = Lease.objects.get(execution_id="op-d-long")
        assert lease.expires_at <= timezone.now() and Execution.objects.get(pk="op-d-long").status == "running"
        assert DrainRequest.objects.get(worker_id=owner["op-d-long"]).finished_at is None  # it never drained
        assert QueueEntry.objects.get(execution_id="op-d-after").state == "pending", "taken after the drain"
    finally:
        for worker in workers.values():
            cleanup(worker)
