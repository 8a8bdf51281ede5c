"""Queues with real loom_worker processes on PostgreSQL: the global cap is never exceeded by four
workers racing for the same queue, including while one of them is SIGKILLed mid-run (its running
execution keeps its slot until the recovery sweep finishes it elsewhere); racing enqueues of one dedup
id or one execution id make one entry; Django tasks run in a worker process.

The running count is sampled independently of the queue's own bookkeeping: executions whose journal
header says running (journal store count_executions), every 10 ms, while the workers run.
"""

from __future__ import annotations

import json
import signal
import threading
import time

import pytest
from django.db import connection, connections

from journal.models import Execution
from journal.store import store_for as journal_store
from queues import declare_queue, enqueue
from queues.declarations import forget
from queues.models import QueueEntry
from tests.fixtures import queue_flows
from tests.leases.test_worker_processes import cleanup, output, spawn_worker, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

CAP = 3
QUEUE = "t-procs"


@pytest.fixture(autouse=True, scope="module")
def stop_the_process_lease_keeper():
    """Runs here start the process's lease keeper thread; stop it at the end of the module, so that its
    connection does not outlive the test database."""
    yield
    from leases.keeper import get_keeper, reset_keeper

    get_keeper().shutdown()
    reset_keeper(None)


@pytest.fixture
def env(child_env, tmp_path):
    child_env.update({
        "LOOM_LEASE_TTL": "1.0", "LOOM_LEASE_RENEW_EVERY": "0.2", "LOOM_LEASE_LAZY_GRACE": "0.2",
        "LOOM_RECOVERY_EVERY": "0.2", "LOOM_FLOW_MODULES": "tests.fixtures.queue_flows", "LOOM_LEASE_MODE": "lazy",
        "LOOM_QUEUES": json.dumps({QUEUE: {"concurrency": CAP}}), "LOOM_QUEUE_THREADS": "3",
        "LOOM_QUEUE_POLL": "0.02", "LOOM_TEST_LOGS": str(tmp_path), "PYTHONFAULTHANDLER": "1",
    })
    return child_env


@pytest.fixture
def queue():
    declare_queue(QUEUE, concurrency=CAP)
    yield QUEUE
    forget(QUEUE)


class Sampler(threading.Thread):
    """Counts the running executions under a prefix every 10 ms; keeps the maximum and the samples."""

    def __init__(self, prefix: str):
        super().__init__(daemon=True)
        self.prefix, self.samples, self.stopping = prefix, [], threading.Event()

    def run(self) -> None:
        try:
            while not self.stopping.wait(0.01):
                self.samples.append(journal_store().count_executions(self.prefix, "running"))
        finally:
            connection.close()

    def stop(self) -> int:
        self.stopping.set()
        self.join()
        return max(self.samples)


def completed(prefix: str) -> int:
    return journal_store().count_executions(prefix, "completed")


def test_four_workers_never_run_more_than_the_cap_even_while_one_is_killed(env, queue):
    total = 24
    ids = [enqueue("queues.test.nap", {"seconds": 0.5}, queue=queue, execution_id=f"qp-{n:03}").execution_id
           for n in range(total)]
    sampler = Sampler("qp-")
    sampler.start()
    workers = [spawn_worker(env, f"qw{n}") for n in range(4)]
    try:
        wait_until(lambda: completed("qp-") >= 3, "the workers started the queue", proc=workers[0])
        # Kill a worker that is running one of them right now (its execution stays running, leased by nobody).
        victim = None
        deadline = time.monotonic() + 30
        while victim is None and time.monotonic() < deadline:
            busy = set(Execution.objects.filter(pk__in=ids, status="running").values_list("pk", flat=True))
            owners = set(QueueEntry.objects.filter(execution_id__in=busy).values_list("worker", flat=True))
            victim = next((w for w in workers if w.args[-1] in owners), None)
        assert victim is not None, "no worker was running anything"
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        wait_until(lambda: completed("qp-") == total, "every queued execution completed", timeout=90)
        highest = sampler.stop()
    finally:
        if sampler.is_alive():
            sampler.stop()
        for worker in workers:
            cleanup(worker)
    assert highest <= CAP, f"{highest} executions ran at once on a queue capped at {CAP}"
    # ... and the sampler saw the queue at its cap (review R6): twelve runner threads and half-second naps
    # fill it, so a dispatcher that ran one at a time, or a sampler blind to running headers, fails here.
    assert highest == CAP, f"the queue never reached its cap of {CAP} (at most {highest} running)"
    assert len(sampler.samples) > 10
    entries = QueueEntry.objects.filter(queue_id=queue)
    assert entries.count() == total and not entries.exclude(state__in=["done", "started"]).exists()
    # The killed worker's run was taken over by another worker's recovery sweep and finished there.
    recovered = Execution.objects.filter(pk__in=ids, recoveries__gt=0)
    assert recovered.exists(), "\n".join(output(w) for w in workers)


def test_racing_enqueues_of_one_dedup_id_make_one_entry(queue):
    barrier = threading.Barrier(8)
    got: list[str] = []

    def racer(n: int) -> None:
        try:
            barrier.wait()
            got.append(enqueue("queues.test.double", {"n": n}, queue=queue, dedup_id="one").execution_id)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=racer, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(got) == 8 and len(set(got)) == 1
    assert QueueEntry.objects.filter(queue_id=queue, dedup_id="one").count() == 1


def test_racing_enqueues_of_one_execution_id_make_one_entry(queue):
    barrier = threading.Barrier(8)
    created: list[bool] = []

    def racer() -> None:
        try:
            barrier.wait()
            created.append(enqueue("queues.test.double", {"n": 1}, queue=queue, execution_id="race-1").created)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=racer) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(created) == [False] * 7 + [True]
    assert QueueEntry.objects.filter(execution_id="race-1").count() == 1


def test_django_tasks_run_in_a_worker_process(env):
    results = [queue_flows.add.enqueue(n, n) for n in range(5)]
    failing = queue_flows.explode.enqueue("in a worker")
    worker = spawn_worker(env, "tw0")
    try:
        wait_until(lambda: all(r.task.get_result(r.id).is_finished for r in [*results, failing]),
                   "the tasks finished", proc=worker)
    finally:
        cleanup(worker)
    assert [queue_flows.add.get_result(r.id).return_value for r in results] == [0, 2, 4, 6, 8]
    failed = queue_flows.explode.get_result(failing.id)
    assert failed.errors[0].exception_class_path == "builtins.ValueError"
    assert all(queue_flows.add.get_result(r.id).worker_ids == ["tw0"] for r in results)


def test_api_starts_and_queueless_cron_ticks_obey_the_default_queue_cap_on_no_cluster_workers(
        child_env, tmp_path, client, settings):
    """Issue #24: API starts and cron ticks without a queue were django-q2 tasks: outside every cap, and with
    `loom_worker --no-cluster` they piled up unrun. Now each is a queued execution on the default queue:
    two --no-cluster workers (6 runner threads) run them all, never more than the default cap at once."""
    import subprocess
    import sys
    from datetime import timedelta

    from django.utils import timezone

    from leases import schedules as sc
    from leases.models import Schedule
    from queues.store import store_for as queue_store
    from tests.conftest import ROOT

    cap, token = 2, "ops-token-0123456789abcdef"
    settings.LOOM_QUEUE_DEFAULT_CONCURRENCY = cap
    settings.LOOM_API_AUTH, settings.LOOM_API_TOKENS = True, [{"token": token, "name": "ops"}]
    env = {**child_env, "LOOM_FLOW_MODULES": "tests.fixtures.queue_flows", "LOOM_QUEUE_THREADS": "3",
           "LOOM_QUEUE_POLL": "0.02", "LOOM_SCHEDULE_EVERY": "0.2", "LOOM_QUEUE_DEFAULT_CONCURRENCY": str(cap),
           "LOOM_LEASE_MODE": "lazy"}
    for n in range(8):
        answer = client.post("/api/flows/queues.test.nap/executions", content_type="application/json",
                             data=json.dumps({"input": {"seconds": 0.3}, "execution_id": f"qc-api-{n}"}),
                             headers={"Authorization": f"Bearer {token}"})
        assert (answer.status_code, answer.json()["status"]) == (202, "queued")
    sc.define("qc-tick", "* * * * * *", "queues.test.nap", {"seconds": 0.3}, catch_up="all")
    Schedule.objects.filter(pk="qc-tick").update(next_tick_at=timezone.now() - timedelta(seconds=5))

    def running() -> int:
        return sum(queue_store().running_by_partition("default").values())

    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        try:
            while not stop.wait(0.01):
                samples.append(running())
        finally:
            connection.close()

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    procs = [subprocess.Popen([sys.executable, "manage.py", "loom_worker", "--no-cluster", "--id", f"qc-{i}"],
                              env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for i in range(2)]
    try:
        def settled() -> tuple[int, int]:
            done = Execution.objects.filter(status="completed")
            return done.filter(pk__startswith="qc-api-").count(), done.filter(pk__startswith="sched:qc-tick:").count()

        wait_until(lambda: settled()[0] == 8 and settled()[1] >= 6, "API starts and cron ticks completed",
                   timeout=120)
        Schedule.objects.filter(pk="qc-tick").update(enabled=False)
    finally:
        stop.set()
        sampler.join()
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=60)
    assert max(samples) <= cap, f"{max(samples)} ran at once on the default queue capped at {cap}"
    assert max(samples) == cap  # the cap was reached: 6 threads, 14 naps
    ticks = QueueEntry.objects.filter(queue_id="default", execution_id__startswith="sched:qc-tick:")
    assert ticks.count() == Execution.objects.filter(pk__startswith="sched:qc-tick:").count() >= 6


def test_300_starts_through_every_door_under_one_cap_run_once_while_workers_are_sigkilled(child_env, settings):
    """Issue #24's fault test: 300 starts arrive at once through five doors (the HTTP API, queues.enqueue,
    start(queue=...), old-scheme django-q2 tasks delivered now, cron ticks without a queue), all on the
    default queue capped at 4, while three `loom_worker --no-cluster` processes run them and one is
    SIGKILLed mid-run (then another). Every start ran exactly once (its atomic step's effect row, counted in
    the database) and no sample of the running executions ever exceeded the cap."""
    import subprocess
    import sys
    from datetime import timedelta

    from django.test import Client
    from django.utils import timezone

    from journal.flows import start
    from leases import schedules as sc
    from leases.models import Schedule
    from leases.tasks import run_start
    from queues.store import store_for as queue_store
    from tests.conftest import ROOT
    from tests.fixtures.lease_flows import create_effects_table, effects, queue_old_scheme_start

    cap, per_door, token = 4, 60, "ops-token-0123456789abcdef"
    settings.LOOM_QUEUE_DEFAULT_CONCURRENCY = cap
    settings.LOOM_API_AUTH, settings.LOOM_API_TOKENS = True, [{"token": token, "name": "ops"}]
    create_effects_table()
    env = {**child_env, "LOOM_FLOW_MODULES": "tests.fixtures.lease_flows", "LOOM_QUEUE_THREADS": "3",
           "LOOM_QUEUE_POLL": "0.02", "LOOM_SCHEDULE_EVERY": "0.2", "LOOM_QUEUE_DEFAULT_CONCURRENCY": str(cap),
           "LOOM_LEASE_TTL": "1.0", "LOOM_LEASE_RENEW_EVERY": "0.2", "LOOM_LEASE_LAZY_GRACE": "0.2",
           "LOOM_RECOVERY_EVERY": "0.2", "LOOM_LEASE_MODE": "lazy", "LOOM_QUEUE_CLAIM_TIMEOUT": "2.0"}
    value = {"n": 1, "pause": 0.05}
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        try:
            while not stop.wait(0.01):
                samples.append(sum(queue_store().running_by_partition("default").values()))
        finally:
            connection.close()

    def door(fn) -> threading.Thread:
        def run() -> None:
            try:
                for n in range(per_door):
                    fn(n)
            finally:
                connections.close_all()

        return threading.Thread(target=run)

    def by_api(n: int) -> None:
        answer = Client().post("/api/flows/leases.steps/executions", content_type="application/json",
                               data=json.dumps({"input": value, "execution_id": f"fx-api-{n:03}"}),
                               headers={"Authorization": f"Bearer {token}"})
        assert answer.status_code == 202, answer.content

    def by_old_task(n: int) -> None:
        queue_old_scheme_start("leases.steps", value, f"fx-old-{n:03}")
        assert run_start("leases.steps", value, f"fx-old-{n:03}", None)["status"] == "queued"  # delivered now

    doors = [door(by_api), door(lambda n: enqueue("leases.steps", value, execution_id=f"fx-enq-{n:03}")),
             door(lambda n: start("leases.steps", value, queue="default", execution_id=f"fx-start-{n:03}")),
             door(by_old_task)]
    sc.define("fx-tick", "* * * * * *", "leases.steps", value, catch_up="all")
    Schedule.objects.filter(pk="fx-tick").update(
        next_tick_at=timezone.now().replace(microsecond=0) - timedelta(seconds=per_door - 1))

    def spawn(i: int) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "manage.py", "loom_worker", "--no-cluster", "--id", f"fx-{i}"],
                                env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def ran() -> list[str]:
        return [e for e, _ in effects() if e.startswith(("fx-", "sched:fx-tick:"))]

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    procs = [spawn(i) for i in range(3)]
    try:
        for thread in doors:
            thread.start()
        wait_until(lambda: len(ran()) >= 40, "the workers run the starts", timeout=120)
        procs[0].send_signal(signal.SIGKILL)  # mid-run: its runs are recovered by the others
        procs[0].wait()
        wait_until(lambda: len(ran()) >= 150, "the others go on", timeout=120)
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait()
        procs.append(spawn(3))
        for thread in doors:
            thread.join()
        Schedule.objects.filter(pk="fx-tick").update(enabled=False)
        ticks = Execution.objects.filter(pk__startswith="sched:fx-tick:").count()
        assert ticks >= per_door
        total = 4 * per_door + ticks
        wait_until(lambda: Execution.objects.filter(status="completed", flow="leases.steps").count() == total,
                   "every start completed", timeout=240)
    finally:
        stop.set()
        sampler.join()
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=60)
    done = ran()
    assert len(done) == len(set(done)) == total, "a start ran twice or not at all"
    assert max(samples) <= cap, f"{max(samples)} ran at once on the default queue capped at {cap}"
    assert max(samples) == cap  # the cap was reached (nine runner threads, 300 starts): it was what held
