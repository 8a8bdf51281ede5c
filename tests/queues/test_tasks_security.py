"""Issue 25 (High): the flow `loom.task` runs only tasks that LoomBackend.enqueue signed for that execution.

Before, `call_task` imported whatever `input["task"]` named: a start of `loom.task` from the API, the
schedule form or a hand-written queue row imported arbitrary modules and called any `@task` with chosen
arguments, and a module raising SystemExit at import killed the process. Now the path is verified (Django's
signing over the execution id and the path; SECRET_KEY_FALLBACKS verify too) before anything is imported;
a refused path fails the execution with UnverifiedTask, and get_result never imports it either. A task raising
SystemExit or KeyboardInterrupt is a failed attempt (the result FAILED after its ATTEMPTS), not an exit.
"""

from __future__ import annotations

import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from journal.flows import start
from journal.models import Execution
from queues import enqueue
from queues.tasks import TASK_FLOW, LoomBackend, UnverifiedTask, sign_task, verified_path
from tests.fixtures import queue_flows
from tests.queues.test_tasks_backend import work

try:
    from django.tasks import TaskResultStatus, task_backends
    from django.tasks.exceptions import TaskResultDoesNotExist
except ImportError:  # Django 5.2
    from django_tasks import TaskResultStatus, task_backends
    from django_tasks.exceptions import TaskResultDoesNotExist

pytestmark = pytest.mark.django_db
BOMB = "tests.fixtures.task_import_bomb.anything"


@pytest.fixture(autouse=True)
def never_imported():
    sys.modules.pop("tests.fixtures.task_import_bomb", None)
    yield
    assert "tests.fixtures.task_import_bomb" not in sys.modules, "the backend imported a path it was not given"


def task_input(path: str, signature: str | None = None, **more) -> dict:
    data = {"task": path, "args": [], "kwargs": {}, "takes_context": False, "attempts": 1, **more}
    if signature is not None:
        data["signature"] = signature
    return data


def test_a_start_of_loom_task_naming_any_module_fails_without_importing_it():
    """As the API's `POST /api/flows/loom.task/call` and the schedule form did: before, the process exited."""
    outcome = start(TASK_FLOW, task_input(BOMB), execution_id="t-sec-1")
    assert outcome.status == "failed" and outcome.error.startswith("UnverifiedTask:")
    assert "no signed task" in outcome.error
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result("t-sec-1")


def test_a_queue_row_naming_a_real_task_without_a_signature_does_not_run_it():
    queue_flows.FLAKY_CALLS.clear()
    queued = enqueue(TASK_FLOW, task_input(queue_flows.flaky.module_path, takes_context=True) | {"args": ["q"]})
    assert work() == ["failed"]
    assert queue_flows.FLAKY_CALLS == {}
    assert Execution.objects.get(pk=queued.execution_id).error.startswith("UnverifiedTask:")


def test_a_signature_of_another_execution_or_another_path_is_refused():
    real = queue_flows.add.enqueue(1, 2)
    signature = Execution.objects.get(pk=real.id).input["signature"] if Execution.objects.filter(
        pk=real.id).exists() else None
    if signature is None:  # before the header exists at enqueue: the entry holds the input
        from queues.models import QueueEntry
        from queues.store.base import decode

        signature = decode(QueueEntry.objects.get(execution_id=real.id).input)["signature"]
    moved = start(TASK_FLOW, task_input(queue_flows.add.module_path, signature, args=[5, 5]), execution_id="t-sec-2")
    assert moved.status == "failed" and "not valid" in moved.error
    other_path = start(TASK_FLOW, task_input(BOMB, sign_task("t-sec-3", queue_flows.add.module_path)),
                       execution_id="t-sec-3")
    assert other_path.status == "failed" and "not valid" in other_path.error
    assert work() == ["completed"]  # the real one still runs
    assert queue_flows.add.get_result(real.id).return_value == 3


def test_a_key_rotated_into_secret_key_fallbacks_still_verifies_and_a_dropped_key_does_not(settings):
    settings.SECRET_KEY = "old-key-" + "x" * 50
    signature = sign_task("t-sec-4", queue_flows.add.module_path)
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = "new-key-" + "y" * 50, [settings.SECRET_KEY]
    assert verified_path(task_input(queue_flows.add.module_path, signature), "t-sec-4") == queue_flows.add.module_path
    settings.SECRET_KEY_FALLBACKS = []
    with pytest.raises(UnverifiedTask):
        verified_path(task_input(queue_flows.add.module_path, signature), "t-sec-4")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.one_of(st.just(BOMB), st.text(max_size=60)), signature=st.one_of(st.none(), st.text(max_size=60)),
       extra=st.dictionaries(st.sampled_from(["args", "kwargs", "attempts", "takes_context"]),
                             st.one_of(st.integers(), st.text(max_size=5), st.lists(st.integers(), max_size=2))))
def test_any_unsigned_input_of_loom_task_is_refused_with_our_error(path, signature, extra):
    """Whatever a caller puts in the input, the refusal is UnverifiedTask and nothing is imported or run."""
    before = set(sys.modules)
    data = {**extra, "task": path} if signature is None else {**extra, "task": path, "signature": signature}
    with pytest.raises(UnverifiedTask):
        verified_path(data, "t-sec-h")
    assert set(sys.modules) == before


@pytest.mark.parametrize(("task", "kind"), [(queue_flows.exits, "builtins.SystemExit"),
                                            (queue_flows.interrupted, "builtins.KeyboardInterrupt")])
def test_system_exit_or_keyboard_interrupt_in_a_task_is_a_failed_attempt(task, kind):
    """Before: SystemExit went through the step and the flow (a thread or process exit); now each attempt fails
    with its class recorded and after ATTEMPTS the result is FAILED, as django-tasks-db's db_worker does."""
    backend = LoomBackend("default", {"QUEUES": ["default"], "OPTIONS": {"ATTEMPTS": 2}})
    args = [3] if task is queue_flows.exits else []
    result = backend.enqueue(task, args, {})
    assert work() == ["failed"]
    result = task.get_result(result.id)
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in result.errors] == [kind, kind]
    assert kind.split(".")[1] in result.errors[-1].traceback
    assert Execution.objects.get(pk=result.id).error.startswith(kind)
