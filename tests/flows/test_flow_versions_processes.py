"""A deploy of version 2 of a flow while 100 executions of version 1 wait on timers and messages, with a real
`loom_worker` of each version: one lists only tests.fixtures.version_flows_v1 (version 1), the other only
tests.fixtures.version_flows_v2 (version 2: its steps differ before the wait, so a version-1 log replayed on it would
be NonDeterminism). Every execution completes on the version it started on, run by the worker that has it;
none fails. The same for queued starts of both versions, enqueued while both workers run: each worker's
dispatcher claims only the entries of its own version. SQLite and PostgreSQL (as every test, by
DATABASE_URL)."""

from __future__ import annotations

import pytest

from journal.flows import ownership, send, start
from journal.models import Execution
from leases.models import Worker as WorkerRow
from queues import enqueue
from tests.fixtures import (  # noqa: F401  (registers both versions of both flows here)
    version_flows_v1,
    version_flows_v2,
    version_queued_v1,
    version_queued_v2,
)
from tests.fixtures.version_common import create_effects_table, drop_effects_table, effects
from tests.flows.test_flow_versions import release
from tests.flows.test_waits_processes import Worker, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

SETTLED = ("completed", "failed", "cancelled", "stuck")


@pytest.fixture
def env(child_env, settings, tmp_path):
    settings.LOOM_WAIT_INLINE_MAX = 0.0
    child_env.update({
        "LOOM_LEASE_TTL": "2.0", "LOOM_LEASE_RENEW_EVERY": "0.3", "LOOM_LEASE_LAZY_GRACE": "0.3",
        "LOOM_RECOVERY_EVERY": "0.3", "LOOM_LEASE_MODE": "lazy", "LOOM_WAIT_INLINE_MAX": "0",
        "LOOM_WAIT_POLL": "0.2", "PYTHONFAULTHANDLER": "1", "LOOM_TEST_LOGS": str(tmp_path),
        "LOOM_QUEUE_POLL": "0.05", "LOOM_QUEUE_THREADS": "4",
    })
    installed = ownership.get_ownership()
    ownership.set_ownership(None)  # this process only starts executions and sends messages
    yield child_env
    ownership.set_ownership(installed)


@pytest.fixture
def worker_of(env):
    started: list[Worker] = []

    def spawn(name: str, modules: str) -> Worker:
        worker = Worker({**env, "LOOM_FLOW_MODULES": modules, "LOOM_WORKER_ID": name}, name)
        started.append(worker)
        return worker

    yield spawn
    for worker in started:
        worker.stop()


def test_a_deploy_of_version_2_leaves_every_waiting_version_1_execution_to_the_worker_that_has_it(worker_of):
    # Release 1 is live: 100 executions of version 1 wait, half on a timer, half on a message.
    with release("ver.order", 1):
        for n in range(100):
            wait = {"wait": "timer", "seconds": 1} if n % 2 else {"wait": "message"}
            assert start("ver.order", {"n": n, **wait}, execution_id=f"dep-v1-{n}").status == "waiting"
    # Release 2 is deployed beside it: new starts take version 2 (and wait the same way).
    for n in range(20):
        wait = {"wait": "timer", "seconds": 1} if n % 2 else {"wait": "message"}
        assert start("ver.order", {"n": n, **wait}, execution_id=f"dep-v2-{n}").status == "waiting"
    assert set(Execution.objects.filter(pk__startswith="dep-v1-").values_list("flow_version", flat=True)) == {1}
    assert set(Execution.objects.filter(pk__startswith="dep-v2-").values_list("flow_version", flat=True)) == {2}
    old = worker_of("worker-v1", "tests.fixtures.version_flows_v1")
    new = worker_of("worker-v2", "tests.fixtures.version_flows_v2")
    for prefix, count in (("dep-v1-", 100), ("dep-v2-", 20)):
        for n in range(0, count, 2):
            send(f"{prefix}{n}", "go", {"n": n})

    def settled() -> bool:
        return not Execution.objects.filter(pk__startswith="dep-").exclude(status__in=SETTLED).exists()

    wait_until(settled, "every execution of both versions settled", [old, new], timeout=180.0)
    rows = list(Execution.objects.filter(pk__startswith="dep-").values_list("id", "status", "flow_version", "result",
                                                                          "error", "recoveries"))
    assert len(rows) == 120
    failed = [(eid, error) for eid, status, _, _, error, _ in rows if status != "completed"]
    assert failed == []  # none failed: no NonDeterminism, no UnknownFlow
    # Woken by the worker that has its version, never claimed by the other one first (a claim refused for
    # want of the version leaves the execution to the recovery sweep: a recovery each).
    assert [eid for eid, *_, recoveries in rows if recoveries] == []
    for eid, _, version, result, _, _ in rows:
        assert result["version"] == version, eid  # completed on the version it started on
        assert result["by"] == ("worker-v1" if version == 1 else "worker-v2"), eid  # by the worker that has it


@pytest.fixture
def version_effects():
    create_effects_table()
    yield
    drop_effects_table()


def test_queued_starts_of_two_versions_each_run_on_their_own_version_by_the_worker_that_has_it(
        worker_of, version_effects):
    """Before: each dispatcher claimed by flow name and ran the newest version it had, so the version-2
    worker ran version-1 entries on version 2 and the version-1 worker ran version-2 entries on version 1."""
    old = worker_of("worker-v1", "tests.fixtures.version_queued_v1")
    new = worker_of("worker-v2", "tests.fixtures.version_queued_v2")
    wait_until(lambda: WorkerRow.objects.filter(id__in=["worker-v1", "worker-v2"]).count() == 2,
               "both workers are up", [old, new])
    for n in range(40):  # interleaved, while both run: v1 from a release-1 process, v2 from a release-2 one
        with release("ver.queued", 1):
            enqueue("ver.queued", {"n": n}, execution_id=f"qv-1-{n}")
        with release("ver.queued", 2):
            enqueue("ver.queued", {"n": n}, execution_id=f"qv-2-{n}")

    def settled() -> bool:
        return not Execution.objects.filter(pk__startswith="qv-").exclude(status__in=SETTLED).exists()

    wait_until(settled, "every queued execution of both versions settled", [old, new], timeout=180.0)
    rows = list(Execution.objects.filter(pk__startswith="qv-").values_list("id", "status", "flow_version", "result",
                                                                         "error"))
    assert len(rows) == 80
    assert [(eid, error) for eid, status, _, _, error in rows if status != "completed"] == []
    for eid, _, version, result, _ in rows:
        assert version == int(eid.split("-")[1]), eid  # pinned at enqueue to the enqueuing release's version
        assert result == {"version": version, "by": f"worker-v{version}"}, eid
    # One recorded run per execution, of its own version, by the worker that has it.
    assert effects() == sorted((eid, version, f"worker-v{version}") for eid, _, version, _, _ in rows)
