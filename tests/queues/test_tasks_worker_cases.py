"""django-tasks-db's worker cases (DatabaseBackendWorkerTestCase, DatabaseWorkerProcessTestCase), under their
names, against LoomBackend and loom_worker. Its sdist cannot run them as written (docs/queues.md,
"Conformance"): it ships no tasks module and every case drives db_worker and reads DBTaskResult rows. Here the
worker is the dispatcher's dequeue and run_claimed in this process (both databases), and real loom_worker
processes on PostgreSQL for the process cases: a task raising SystemExit or KeyboardInterrupt fails, and the
worker goes on.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from journal.flows import registry
from queues.models import QueueEntry
from queues.store import store_for
from tests.fixtures import queue_flows
from tests.queues.test_tasks_backend import work

try:
    from django.tasks import TaskResultStatus
except ImportError:  # Django 5.2
    from django_tasks import TaskResultStatus


@pytest.fixture(autouse=True, scope="module")
def stop_the_process_lease_keeper():
    yield
    from leases.keeper import get_keeper, reset_keeper

    get_keeper().shutdown()
    reset_keeper(None)


@pytest.mark.django_db
class TestWorkerCases:
    def test_run_enqueued_task(self):
        result = queue_flows.add.enqueue(1, 2)
        assert result.status == TaskResultStatus.READY
        assert work() == ["completed"]
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 3 and result.attempts == 1

    def test_batch_processes_all_tasks(self):
        results = [queue_flows.add.enqueue(n, 1) for n in range(5)] + [queue_flows.explode.enqueue("x")]
        assert sorted(work()) == ["completed"] * 5 + ["failed"]
        assert all(r.task.get_result(r.id).is_finished for r in results)

    def test_no_tasks(self):
        assert work() == []

    def test_doesnt_process_different_queue(self, settings):
        settings.TASKS = {"default": {"BACKEND": "queues.tasks.LoomBackend", "QUEUES": []}}
        from queues.declarations import forget

        try:
            other = queue_flows.add.using(queue_name="t-other").enqueue(1, 1)
            assert work("default") == []
            assert queue_flows.add.get_result(other.id).status == TaskResultStatus.READY
            assert work("t-other") == ["completed"]
        finally:
            forget("t-other")

    def test_failing_task(self):
        result = queue_flows.explode.enqueue("This Task failed due to ValueError")
        work()
        result.refresh()
        assert result.status == TaskResultStatus.FAILED
        (error,) = result.errors
        assert error.exception_class is ValueError
        assert error.traceback.endswith("ValueError: This Task failed due to ValueError\n")

    def test_complex_exception(self):
        result = queue_flows.complex_exception.enqueue()
        work()
        result.refresh()
        assert result.status == TaskResultStatus.FAILED and result.errors[0].exception_class is ValueError

    def test_complex_return_value(self):
        result = queue_flows.unreturnable.enqueue()
        work()
        result.refresh()
        assert result.status == TaskResultStatus.FAILED and result.errors[0].exception_class is TypeError

    def test_run_after(self):
        result = queue_flows.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(1, 1)
        assert work() == []
        QueueEntry.objects.filter(execution_id=result.id).update(run_after=timezone.now() - timedelta(seconds=1))
        assert work() == ["completed"]

    def test_run_after_priority(self):
        now = timezone.now()
        later = queue_flows.add.using(priority=10, run_after=now + timedelta(hours=1)).enqueue(0, 0)
        low = queue_flows.add.using(priority=-5).enqueue(0, 1)
        high = queue_flows.add.using(priority=5).enqueue(0, 2)
        claimed = store_for().dequeue("default", "w", 10, sorted(registry.registered()), 3600.0)
        assert [c.execution_id for c in claimed] == [high.id, low.id]  # not the deferred one
        assert later.id not in [c.execution_id for c in claimed]

    def test_takes_context(self):
        result = queue_flows.who_runs_me.enqueue()
        work()
        assert queue_flows.who_runs_me.get_result(result.id).return_value["attempts"] == 1

    def test_system_exit_task(self):
        result = queue_flows.exits.enqueue(1)
        assert work() == ["failed"]
        assert queue_flows.exits.get_result(result.id).errors[0].exception_class is SystemExit

    def test_keyboard_interrupt_task(self):
        result = queue_flows.interrupted.enqueue()
        assert work() == ["failed"]
        assert queue_flows.interrupted.get_result(result.id).errors[0].exception_class is KeyboardInterrupt


@pytest.fixture
def env(child_env, tmp_path):
    child_env.update({"LOOM_FLOW_MODULES": "tests.fixtures.queue_flows", "LOOM_QUEUE_POLL": "0.02",
                      "LOOM_QUEUE_THREADS": "2", "LOOM_TEST_LOGS": str(tmp_path)})
    return child_env


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_worker_doesnt_exit_on_failure_system_exit_or_keyboard_interrupt(env):
    """DatabaseWorkerProcessTestCase.test_system_exit_task/test_keyboard_interrupt_task and
    test_worker_doesnt_exit_on_failure: the tasks fail, the worker process lives on and runs the next task."""
    from tests.leases.test_worker_processes import cleanup, spawn_worker, wait_until

    bad = [queue_flows.exits.enqueue(3), queue_flows.interrupted.enqueue(), queue_flows.explode.enqueue("x")]
    worker = spawn_worker(env, "tw-exit")
    try:
        wait_until(lambda: all(r.task.get_result(r.id).is_finished for r in bad), "the failing tasks ran", proc=worker)
        after = queue_flows.add.enqueue(20, 22)
        wait_until(lambda: queue_flows.add.get_result(after.id).is_finished, "the next task ran", proc=worker)
        assert worker.poll() is None  # still running
    finally:
        cleanup(worker)
    assert [r.task.get_result(r.id).errors[0].exception_class_path for r in bad] == [
        "builtins.SystemExit", "builtins.KeyboardInterrupt", "builtins.ValueError"]
    assert queue_flows.add.get_result(after.id).return_value == 42


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_multiple_workers(env):
    """DatabaseWorkerProcessTestCase.test_multiple_workers: two workers, every task run once."""
    from tests.leases.test_worker_processes import cleanup, spawn_worker, wait_until

    results = [queue_flows.add.enqueue(n, 0) for n in range(20)]
    workers = [spawn_worker(env, "tw-m1"), spawn_worker(env, "tw-m2")]
    try:
        wait_until(lambda: all(r.task.get_result(r.id).is_finished for r in results), "the tasks ran",
                   proc=workers[0])
    finally:
        for worker in workers:
            cleanup(worker)
    fetched = [queue_flows.add.get_result(r.id) for r in results]
    assert [f.return_value for f in fetched] == list(range(20))
    assert all(len(f.worker_ids) == 1 and f.worker_ids[0] in ("tw-m1", "tw-m2") for f in fetched)
