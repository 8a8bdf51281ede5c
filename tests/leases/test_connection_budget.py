"""The connection budget (docs/workers.md "Connections"): a real loom_worker opens no more sessions than
leases/budget.py says for its settings, counted in pg_stat_activity by its application_name (PGAPPNAME, which
every session of the process and its children carries), idle and while its queue runners, waker and sweep work;
the database check loom.W130 warns when the planned deployment would open more sessions than the server allows."""

from __future__ import annotations

import json
import threading

import pytest
from django.db import connection

from leases import budget
from leases.checks import check_connection_budget
from tests.conftest import ROOT
from tests.fixtures import queue_flows  # noqa: F401  (registers the flows enqueued here)
from tests.leases.test_worker_processes import cleanup, output, wait_until

APP = "loom-budget-test"


def spawn_worker(env: dict, worker_id: str):
    """`loom_worker --no-cluster` (its own services only: the cluster's processes are counted apart)."""
    import subprocess
    import sys
    from pathlib import Path

    log = open(Path(env["LOOM_TEST_LOGS"]) / f"{worker_id}.log", "w")  # noqa: SIM115 (closed by cleanup)
    proc = subprocess.Popen([sys.executable, "manage.py", "loom_worker", "--id", worker_id, "--no-cluster"], env=env,
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    proc.log = log
    return proc


def sessions() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [APP])
        return cursor.fetchone()[0]


@pytest.fixture(autouse=True, scope="module")
def stop_the_process_lease_keeper():
    yield
    from leases.keeper import get_keeper, reset_keeper

    get_keeper().shutdown()
    reset_keeper(None)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_loom_worker_opens_no_more_sessions_than_its_budget(child_env, tmp_path, settings):
    from journal.models import Execution
    from queues import declare_queue, enqueue
    from queues.declarations import forget

    sizes = {"LOOM_QUEUE_THREADS": 3, "LOOM_WAIT_BATCH": 4, "LOOM_RECOVERY_BATCH": 2}
    child_env.update({name: str(value) for name, value in sizes.items()})
    child_env.update({"PGAPPNAME": APP, "LOOM_FLOW_MODULES": "tests.fixtures.queue_flows", "LOOM_QUEUE_POLL": "0.02",
                      "LOOM_QUEUES": json.dumps({"t-budget": {"concurrency": 3}}), "LOOM_TEST_LOGS": str(tmp_path)})
    for name, value in sizes.items():
        setattr(settings, name, value)
    limit = sum(budget.worker_connections(cluster=False).values())
    assert limit == budget.WORKER_SERVICES + 3 + 4 + 2
    declare_queue("t-budget", concurrency=3)
    worker = spawn_worker(child_env, "budget-w0")
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        try:
            while not stop.wait(0.02):
                samples.append(sessions())
        finally:
            connection.close()

    try:
        wait_until(lambda: " running " in output(worker), "the worker runs", proc=worker)
        idle = sessions()
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        ids = [enqueue("queues.test.nap", {"seconds": 0.3}, queue="t-budget", execution_id=f"cb-{n}").execution_id
               for n in range(9)]
        wait_until(lambda: Execution.objects.filter(pk__in=ids, status="completed").count() == 9,
                   "the queued runs completed", proc=worker)
        stop.set()
        sampler.join()
    finally:
        stop.set()
        cleanup(worker)
        forget("t-budget")
    peak = max(samples)
    print(f"\nloom_worker sessions: idle {idle}, peak {peak} (budget {limit}: {budget.worker_connections(False)})")
    assert 0 < idle <= budget.WORKER_SERVICES, idle
    assert peak <= limit, (peak, limit)
    assert peak > idle, (peak, idle)  # the runners' sessions were seen: the count measures this worker


@pytest.mark.django_db
@pytest.mark.parametrize("planned, warned", [(None, False), (1, False), (100_000, True)])
def test_the_budget_check_warns_only_when_the_plan_exceeds_the_server(settings, planned, warned):
    settings.LOOM_PLANNED_WORKERS = planned
    problems = check_connection_budget(databases=["default"])
    if connection.vendor != "postgresql":
        assert problems == []  # SQLite has no connection limit to plan against
        return
    assert [p.id for p in problems] == (["loom.W130"] if warned else []), problems
    if warned:
        assert "max_connections" in problems[0].msg and "'default'" in problems[0].msg


@pytest.mark.django_db
def test_the_budget_check_is_a_database_check_and_counts_api_workers(settings):
    """It runs only when asked (`check --database`): without databases it reads nothing; API workers count."""
    settings.LOOM_PLANNED_API_WORKERS = 100_000
    settings.LOOM_PLANNED_API_THREADS = 4
    assert check_connection_budget(databases=None) == []
    assert budget.planned_connections() == 100_000 * budget.api_connections(4)


POOLED = """
import os, threading
from django.db import connection, connections
from journal.flows import start
from tests.fixtures import flows_fixtures  # noqa: F401 (registers the flows)
done, refused = [], []
def run(k):
    for i in range(5):
        try:
            done.append(start("test.add", {"a": k, "b": i}, execution_id=f"{os.environ['PREFIX']}-{k}-{i}").result)
        except Exception as exc:
            refused.append(str(exc))
    connections.close_all()
threads = [threading.Thread(target=run, args=(k,)) for k in range(6)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("DONE", len(done), "POOL", connection.settings_dict["OPTIONS"]["pool"]["max_size"])
print("REFUSED", refused[:1])
"""


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_django_s_own_pool_bounds_a_process_s_sessions(child_env):
    """PG_POOL (loomsite: Django's OPTIONS["pool"], Django >= 5.1). A worker thread keeps its session for a whole
    run, so the pool must hold as many as the process's threads that use the database at once (six flow threads
    and the lease keeper: 7): then every flow completes and the process never holds more; a smaller pool makes
    threads wait, and past PG_POOL_TIMEOUT a start is refused with an OperationalError (an execution already
written stays running, for the recovery sweep)."""
    import django

    from journal.models import Execution
    from tests.conftest import run_child

    if django.VERSION < (5, 1):
        pytest.skip("Django's connection pool needs Django 5.1 or later")
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        try:
            while not stop.wait(0.01):
                samples.append(sessions())
        finally:
            connection.close()

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        child_env.update({"PG_POOL": "1:7", "PGAPPNAME": APP, "LOOM_FLOW_MODULES": "tests.fixtures.flows_fixtures",
                          "PREFIX": "pool"})
        out = run_child(POOLED, child_env).stdout
        child_env.update({"PG_POOL": "1:2", "PG_POOL_TIMEOUT": "0.5", "PREFIX": "small"})
        small = run_child(POOLED, child_env).stdout
    finally:
        stop.set()
        sampler.join()
    assert "DONE 30 POOL 7" in out, out
    assert Execution.objects.filter(pk__startswith="pool-", status="completed").count() == 30
    assert 0 < max(samples) <= 7, samples
    assert "DONE 30" not in small and "couldn't get a connection" in small, small
    # A refused start wrote nothing, or (refused after its bootstrap) left its execution running for a sweep to
    # recover: none failed.
    assert not Execution.objects.filter(pk__startswith="small-").exclude(status__in=["completed", "running"]).exists()
