"""Operating a deployment with real loom_worker processes on PostgreSQL: a paused queue is not dispatched from
by two workers racing for it (while they go on dispatching another queue), a pending entry of it can still be
cancelled, and its entries all run once it is resumed; a drained worker takes nothing new, lets its running
execution finish (completed, not handed back), and exits by itself."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command

from journal.models import Execution
from leases.models import DrainRequest, Worker
from queues import declare_queue, enqueue, pause
from queues.declarations import forget
from queues.models import QueueEntry
from tests import queue_flows  # noqa: F401  (the flows)
from tests.test_worker_processes import cleanup, output, spawn_worker, wait_until

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
        "LOOM_FLOW_MODULES": "tests.queue_flows", "LOOM_LEASE_MODE": "eager", "LOOM_QUEUE_THREADS": "2",
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


def test_a_drained_worker_finishes_its_run_takes_nothing_new_and_exits(env, queues_declared):
    worker = spawn_worker(env, "opw-drain")
    try:
        enqueue("queues.test.nap", {"seconds": 1.5}, queue=OTHER, execution_id="op-d-long")
        wait_until(lambda: Execution.objects.filter(pk="op-d-long", status="running").exists(), "the run began",
                   proc=worker)
        call_command("loom", "workers", "drain", "opw-drain")
        wait_until(lambda: DrainRequest.objects.filter(worker_id="opw-drain", started_at__isnull=False).exists(),
                   "the worker saw its drain request", proc=worker)
        enqueue("queues.test.nap", {"seconds": 0.0}, queue=OTHER, execution_id="op-d-after")
        assert worker.wait(timeout=60) == 0, output(worker)
        run = Execution.objects.get(pk="op-d-long")
        assert run.status == "completed" and run.recoveries == 0, (run.status, output(worker))
        assert QueueEntry.objects.get(execution_id="op-d-after").state == "pending", "taken after the drain"
        assert DrainRequest.objects.get(worker_id="opw-drain").finished_at is not None
        assert Worker.objects.get(pk="opw-drain").stopped_at is not None
        assert "drained (no run left); exiting" in output(worker)
    finally:
        cleanup(worker)


def test_a_sigterm_during_a_drain_is_a_graceful_shutdown_that_hands_the_run_back(env, queues_declared):
    """drain x LOOM_SHUTDOWN_GRACE: a drain waits for the run to end; a SIGTERM meanwhile stops it at its next
    step boundary after the grace, its lease handed back (expired at once) for another worker to continue."""
    import signal

    from django.utils import timezone

    from leases.models import Lease

    env["LOOM_SHUTDOWN_GRACE"] = "0.5"
    worker = spawn_worker(env, "opw-term")
    try:
        enqueue("queues.test.nap", {"seconds": 30}, queue=OTHER, execution_id="op-t-long")
        wait_until(lambda: Execution.objects.filter(pk="op-t-long", status="running").exists(), "the run began",
                   proc=worker)
        call_command("loom", "workers", "drain", "opw-term")
        wait_until(lambda: DrainRequest.objects.filter(worker_id="opw-term", started_at__isnull=False).exists(),
                   "the worker saw its drain request", proc=worker)
        assert worker.poll() is None  # draining: the 30 s step still runs
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0, output(worker)
        # Interrupted after the grace (the step was mid-way): its lease expired at once, not left to lapse.
        lease = Lease.objects.get(execution_id="op-t-long")
        assert lease.expires_at <= timezone.now() and Execution.objects.get(pk="op-t-long").status == "running"
        assert DrainRequest.objects.get(worker_id="opw-term").finished_at is None  # it did not finish draining
    finally:
        cleanup(worker)
