"""Django's documented Task semantics on queues.tasks.LoomBackend, on Django 6 (django.tasks) and
Django 5.2 (the django-tasks backport): enqueue, get_result, statuses, return values, errors,
attempts, takes_context, run_after, priority, aenqueue; arguments that are not JSON are refused with
our error and nothing queued.

The tasks run here the way a loom_worker runs them (its dispatcher's dequeue and run_claimed), in this
process; tests/queues/test_queues_processes.py runs them in real worker processes.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from asgiref.sync import async_to_sync
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from journal.flows import registry
from queues.models import QueueEntry
from queues.service import run_claimed
from queues.store import store_for
from queues.tasks import TASK_FLOW, InvalidTaskArguments, LoomBackend, sign_task
from tests.fixtures import queue_flows

try:
    from django.tasks import TaskResultStatus, task_backends
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist, TaskResultMismatch
    from django.tasks.signals import task_enqueued, task_finished, task_started
except ImportError:  # Django 5.2
    from django_tasks import TaskResultStatus, task_backends
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
    from django_tasks.signals import task_enqueued, task_finished, task_started

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True, scope="module")
def stop_the_process_lease_keeper():
    """Runs here start the process's lease keeper thread; stop it at the end of the module, so that its
    connection does not outlive the test database."""
    yield
    from leases.keeper import get_keeper, reset_keeper

    get_keeper().shutdown()
    reset_keeper(None)


def work(queue: str = "default", limit: int = 100) -> list[str]:
    """What a worker does: claim the queue's due entries within its caps and run each; their statuses."""
    claimed = store_for().dequeue(queue, "test-worker", limit, sorted(registry.registered()), 3600.0)
    return [run_claimed(entry) for entry in claimed or []]  # None: the queue has no row yet (PostgreSQL)


def test_the_configured_backend_is_loom():
    assert isinstance(task_backends["default"], LoomBackend)
    backend = task_backends["default"]
    assert backend.supports_defer and backend.supports_get_result and backend.supports_priority
    assert backend.supports_async_task


def test_the_old_path_journal_tasks_is_the_same_backend_with_a_deprecation_warning(settings):
    """A TASKS setting naming journal.tasks.LoomBackend (the path before the backend moved to queues/tasks.py)
    keeps working: Django builds the same class, and the import says the new path (docs/queues.md)."""
    import importlib
    import sys

    sys.modules.pop("journal.tasks", None)
    with pytest.warns(DeprecationWarning, match="queues.tasks.LoomBackend"):
        old = importlib.import_module("journal.tasks")
    assert old.LoomBackend is LoomBackend and old.sign_task is sign_task and old.TASK_FLOW == TASK_FLOW
    settings.TASKS = {"old": {"BACKEND": "journal.tasks.LoomBackend", "QUEUES": ["default"]}}
    assert type(task_backends["old"]) is LoomBackend


def test_enqueue_returns_a_ready_result_and_a_worker_makes_it_successful():
    result = queue_flows.add.enqueue(2, 3)
    assert result.status == TaskResultStatus.READY and not result.is_finished
    assert result.args == [2, 3] and result.kwargs == {} and result.backend == "default"
    with pytest.raises(ValueError):
        result.return_value  # noqa: B018  (not finished: Django raises)
    stored = queue_flows.add.get_result(result.id)
    assert stored.status == TaskResultStatus.READY and stored.enqueued_at is not None and stored.started_at is None
    assert work() == ["completed"]
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.is_finished
    assert result.return_value == 5
    assert result.started_at is not None and result.finished_at is not None and result.finished_at >= result.started_at
    assert result.attempts == 1 and len(result.worker_ids) == 1 and result.errors == []


def test_the_result_id_is_the_execution_id_and_the_execution_is_a_loom_task():
    from journal.models import Execution

    result = queue_flows.shout.enqueue("hi")
    work()
    execution = Execution.objects.get(pk=result.id)
    assert (execution.flow, execution.status, execution.result) == (TASK_FLOW, "completed", "HI")


def test_an_exception_fails_the_task_with_its_class_path_and_traceback():
    result = queue_flows.explode.enqueue("boom")
    assert work() == ["failed"]
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and result.is_finished
    (error,) = result.errors
    assert error.exception_class_path == "builtins.ValueError" and error.exception_class is ValueError
    assert "ValueError: boom" in error.traceback and "explode" in error.traceback
    with pytest.raises(ValueError):
        result.return_value  # noqa: B018


def test_a_return_value_that_is_not_json_fails_the_task():
    result = queue_flows.unreturnable.enqueue()
    work()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class_path == "builtins.TypeError"


def test_attempts_retry_a_failed_call_and_the_context_counts_them():
    backend = LoomBackend("default", {"QUEUES": ["default"], "OPTIONS": {"ATTEMPTS": 3}})
    queue_flows.FLAKY_CALLS.clear()
    result = backend.enqueue(queue_flows.flaky, ["k1"], {})
    assert work() == ["completed"]
    result = queue_flows.flaky.get_result(result.id)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 2  # context.attempt on the second call
    assert result.attempts == 2 and [e.exception_class_path for e in result.errors] == ["builtins.RuntimeError"]
    assert queue_flows.FLAKY_CALLS["k1"] == 2


def test_djangos_task_signals_are_sent():
    seen: list[tuple[str, str, str]] = []

    def note(name):
        def receiver(sender, task_result, **kwargs):
            seen.append((name, task_result.id, str(task_result.status)))
        return receiver

    receivers = [(task_enqueued, note("enqueued")), (task_started, note("started")), (task_finished, note("finished"))]
    for signal, receiver in receivers:
        signal.connect(receiver)
    try:
        ok = queue_flows.add.enqueue(1, 2)
        bad = queue_flows.explode.enqueue("x")
        work()
    finally:
        for signal, receiver in receivers:
            signal.disconnect(receiver)
    assert [s for s in seen if s[1] == ok.id] == [
        ("enqueued", ok.id, "READY"), ("started", ok.id, "RUNNING"), ("finished", ok.id, "SUCCESSFUL")]
    assert [s for s in seen if s[1] == bad.id] == [
        ("enqueued", bad.id, "READY"), ("started", bad.id, "RUNNING"), ("finished", bad.id, "FAILED")]


def test_run_after_defers_the_task():
    later = datetime.now(UTC) + timedelta(hours=1)
    deferred = queue_flows.add.using(run_after=later).enqueue(1, 1)
    now = queue_flows.add.enqueue(2, 2)
    assert work() == ["completed"]
    assert queue_flows.add.get_result(deferred.id).status == TaskResultStatus.READY
    assert queue_flows.add.get_result(now.id).status == TaskResultStatus.SUCCESSFUL
    assert QueueEntry.objects.get(execution_id=deferred.id).run_after == later


def test_priority_orders_the_queue():
    low = queue_flows.add.using(priority=-10).enqueue(0, 1)
    high = queue_flows.add.using(priority=50).enqueue(0, 2)
    default = queue_flows.shout.enqueue("x")  # its decorator's priority 5
    claimed = store_for().dequeue("default", "w", 10, sorted(registry.registered()), 3600.0)
    assert [c.execution_id for c in claimed] == [high.id, default.id, low.id]


def test_aenqueue_and_aget_result():
    result = async_to_sync(queue_flows.add.aenqueue)(4, 5)
    work()
    fetched = async_to_sync(queue_flows.add.aget_result)(result.id)
    assert fetched.status == TaskResultStatus.SUCCESSFUL and fetched.return_value == 9


def test_an_async_task_runs():
    result = queue_flows.asleep.enqueue(1)
    work()
    assert queue_flows.asleep.get_result(result.id).return_value == 2


def test_get_result_of_an_unknown_id_or_of_another_task():
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result("no-such-result")
    result = queue_flows.add.enqueue(1, 2)
    with pytest.raises(TaskResultMismatch):
        queue_flows.shout.get_result(result.id)


def test_get_result_of_an_execution_that_is_not_a_task_does_not_exist():
    from journal.flows import start

    start("queues.test.double", {"n": 1}, execution_id="not-a-task")
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result("not-a-task")


@pytest.mark.parametrize("args", [({1, 2},), (object(),), (float("nan"),), ("\x00",)])
def test_arguments_that_are_not_json_are_refused_and_nothing_is_queued(args):
    before = QueueEntry.objects.count()
    with pytest.raises(InvalidTaskArguments) as raised:
        queue_flows.add.enqueue(*args, 1)
    assert isinstance(raised.value, InvalidTask)  # Django's error too
    assert QueueEntry.objects.count() == before


def test_a_queue_outside_the_backends_queues_is_djangos_invalid_task():
    before = QueueEntry.objects.count()
    with pytest.raises(InvalidTask):
        queue_flows.add.using(queue_name="elsewhere").enqueue(1, 2)
    assert QueueEntry.objects.count() == before


def test_a_result_on_a_queue_this_processs_backend_does_not_list_is_still_readable_and_runs():
    """A worker's backend may list other queues than the enqueuer's: running the task and reading its
    result must not fail on Django's queue validation."""
    from queues import enqueue
    from queues.declarations import forget

    wide = LoomBackend("default", {"QUEUES": ["default", "t-elsewhere"]})  # declares t-elsewhere
    try:
        queued = wide.enqueue(queue_flows.add.using(priority=0), [20, 22], {})  # on "default"
        path = queue_flows.add.module_path
        elsewhere = enqueue(TASK_FLOW, {"task": path, "signature": sign_task("t-elsewhere-1", path), "args": [1, 2],
                                        "kwargs": {}, "takes_context": False, "attempts": 1},
                            queue="t-elsewhere", execution_id="t-elsewhere-1")
        assert work() == ["completed"] and work("t-elsewhere") == ["completed"]
        assert queue_flows.add.get_result(queued.id).return_value == 42
        fetched = queue_flows.add.get_result(elsewhere.execution_id)  # the default backend lists no t-elsewhere
        assert fetched.status == TaskResultStatus.SUCCESSFUL and fetched.return_value == 3
    finally:
        forget("t-elsewhere")


def _not_utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return True
    return False


# Bytes that are UTF-8 are Django's JSON (normalize_json makes them str), as on Django's own backends.
not_json = st.one_of(st.sets(st.integers(), min_size=1), st.binary(min_size=1).filter(_not_utf8), st.complex_numbers(),
                     st.just(float("nan")), st.just(float("inf")), st.builds(object),
                     st.dictionaries(st.integers(), st.integers(), min_size=1), st.just("\x00"))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bad=st.recursive(not_json, lambda inner: st.lists(inner, min_size=1, max_size=2)
                        | st.dictionaries(st.text(max_size=3), inner, min_size=1, max_size=2), max_leaves=4),
       as_kwarg=st.booleans())
def test_any_argument_outside_json_is_refused_with_our_error_and_nothing_queued(bad, as_kwarg):
    before = QueueEntry.objects.count()
    with pytest.raises(InvalidTaskArguments):
        if as_kwarg:
            queue_flows.add.enqueue(1, b=bad)
        else:
            queue_flows.add.enqueue(bad, 1)
    assert QueueEntry.objects.count() == before


bad_ids = st.one_of(st.text(max_size=20).map(lambda s: s + "\ud800"), st.text(max_size=20).map(lambda s: "\x00" + s),
                    st.just(""), st.text(min_size=201, max_size=220), st.integers(), st.none(), st.binary(max_size=4))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(result_id=st.one_of(bad_ids, st.text(max_size=40)))
def test_get_result_of_any_id_it_does_not_know_is_task_result_does_not_exist(result_id):
    """Review R5: lone surrogates, NUL, empty, too long, not a string: Django's contract, no driver error."""
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(result_id)
