"""Issue 27: LoomBackend behaves as Django's own backends and django-tasks-db do, and operators read tasks well.

Each test failed before its fix: enqueue()'s result equals get_result()'s (enqueued_at from the row); a deferred
result keeps its run_after; a RUNNING result names its worker and attempt 1; "QUEUES": [] means any queue and a
name Loom cannot store is InvalidTask at using(); check() names the missing queues app; InvalidTaskArguments is a
TypeError; a failing task's attempts are failed attempts of one step with their errors and tracebacks, the header
error names class and message, a backoff parks the execution between attempts (no thread held), and the task's
dotted name is its flow in the admin list, its filter and the CLI.
"""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command
from django.db import transaction
from django.test.utils import modify_settings
from django.urls import reverse

from journal.flows import describe
from journal.models import Execution
from queues.models import QueueEntry
from queues.store import store_for
from queues.tasks import InvalidTaskArguments, LoomBackend
from tests.fixtures import queue_flows
from tests.queues.test_tasks_backend import work

try:
    from django.tasks import TaskResultStatus, task_backends
    from django.tasks.exceptions import InvalidTask
except ImportError:  # Django 5.2
    from django_tasks import TaskResultStatus, task_backends
    from django_tasks.exceptions import InvalidTaskError as InvalidTask

pytestmark = pytest.mark.django_db


def test_enqueues_result_equals_get_result_even_in_a_transaction_opened_before():
    """Django's test_get_result: enqueued_at was Python's clock after the insert, the row the database's now()."""
    with transaction.atomic():
        Execution.objects.count()  # the transaction (and PostgreSQL's now()) begins here
        result = queue_flows.add.enqueue(1, 2)
        fetched = queue_flows.add.get_result(result.id)
    assert result.enqueued_at == fetched.enqueued_at
    assert result == fetched


def test_a_deferred_results_task_keeps_its_run_after():
    later = datetime.now(UTC) + timedelta(hours=1)
    result = queue_flows.add.using(run_after=later).enqueue(1, 1)
    assert result.task.run_after == later
    assert queue_flows.add.get_result(result.id).task.run_after == later
    assert queue_flows.add.get_result(queue_flows.add.enqueue(1, 1).id).task.run_after is None


def test_a_running_result_names_its_worker_and_attempt_one():
    result = queue_flows.who_runs_me.enqueue()
    (claimed,) = store_for().dequeue("default", "w-claim", 10, ["loom.task"], 3600.0)
    running = queue_flows.who_runs_me.get_result(result.id)  # claimed, not begun yet
    assert running.status == TaskResultStatus.RUNNING and running.worker_ids == ["w-claim"] and running.attempts == 1
    from queues.service import run_claimed

    assert run_claimed(claimed) == "completed"
    seen = queue_flows.who_runs_me.get_result(result.id).return_value
    assert seen["status"] == "RUNNING" and seen["worker_ids"] == ["w-claim"] and seen["attempts"] == 1


def test_an_empty_queues_list_accepts_any_queue_and_a_name_loom_cannot_store_is_invalid_task(settings):
    settings.TASKS = {"default": {"BACKEND": "queues.tasks.LoomBackend", "QUEUES": []}}
    try:
        result = queue_flows.add.using(queue_name="t-anything").enqueue(2, 2)
        assert work("t-anything") == ["completed"]
        assert queue_flows.add.get_result(result.id).return_value == 4
        for bad in ["a\x00b", "x" * 101, ""]:
            with pytest.raises(InvalidTask):
                queue_flows.add.using(queue_name=bad)
    finally:
        from queues.declarations import forget

        forget("t-anything")


def test_check_names_the_missing_queues_app_with_a_hint():
    backend = task_backends["default"]
    assert [e for e in backend.check() if e.id == "loom.E301"] == []
    with modify_settings(INSTALLED_APPS={"remove": ["queues"]}):
        (error,) = [e for e in backend.check() if e.id == "loom.E301"]
        assert "queues" in error.msg and "INSTALLED_APPS" in error.hint
        with pytest.raises(InvalidTask):
            backend.enqueue(queue_flows.add, [1, 2], {})


def test_invalid_task_arguments_is_a_type_error_as_djangos_backends_raise():
    with pytest.raises(TypeError):
        queue_flows.add.enqueue({1}, 2)
    assert issubclass(InvalidTaskArguments, TypeError)


def test_three_attempts_are_three_failed_attempts_with_errors_and_tracebacks(admin_client):
    backend = LoomBackend("default", {"QUEUES": ["default"], "OPTIONS": {"ATTEMPTS": 3}})
    result = backend.enqueue(queue_flows.explode, ["boom"], {})
    assert work() == ["failed"]
    steps = describe(result.id)["steps"]
    assert [(s["step"], s["attempt"], s["status"]) for s in steps] == [
        ("call", 1, "retrying"), ("call", 2, "retrying"), ("call", 3, "failed")]
    assert all(s["error"] == "builtins.ValueError: boom" for s in steps)
    assert all(s["traceback"].startswith("Traceback (most recent call last):\n") for s in steps)
    assert Execution.objects.get(pk=result.id).error == "builtins.ValueError: boom (after 3 attempts)"
    fetched = queue_flows.explode.get_result(result.id)
    assert fetched.status == TaskResultStatus.FAILED and fetched.attempts == 3 and len(fetched.errors) == 3
    page = admin_client.get(reverse("admin:journal_execution_change", args=[result.id])).content.decode()
    timeline = page.split('id="loom-timeline"')[1].split("</table>")[0]  # one traceback per failed attempt
    assert "<pre>Traceback (most recent call last):\n" in timeline and timeline.count('class="loom-traceback"') == 3
    assert '<pre id="loom-traceback">Traceback (most recent call last):' in page  # and the execution's failure


def test_a_backoff_parks_the_task_between_attempts_and_a_wake_runs_the_next():
    """OPTIONS["BACKOFF"] (and @retry per task): the execution waits on a timer, no runner thread held."""
    from journal.flows import wake_now

    backend = LoomBackend("default", {"QUEUES": ["default"], "OPTIONS": {"ATTEMPTS": 2, "BACKOFF": 3600}})
    for task, enqueue in ((queue_flows.explode, lambda: backend.enqueue(queue_flows.explode, ["later"], {})),
                          (queue_flows.patient, lambda: queue_flows.patient.enqueue("p"))):
        result = enqueue()
        assert work() == ["waiting"]  # the run returned: parked on the backoff's timer
        parked = task.get_result(result.id)
        assert parked.status == TaskResultStatus.RUNNING and len(parked.errors) == 1
        assert Execution.objects.get(pk=result.id).status == "waiting"
        wake_now(result.id)
        from journal.flows import wake_due

        wake_due()
        final = Execution.objects.get(pk=result.id)
        assert final.status == "failed" and final.error.endswith("(after 2 attempts)")


def test_the_tasks_dotted_name_is_its_flow_in_the_admin_list_filter_and_the_cli(admin_client):
    result = queue_flows.shout.enqueue("x")
    work()
    forged = Execution.objects.create(id="t-forged", flow="loom.task", status="failed",
                                      input={"task": "tests.fixtures.queue_flows.shout", "signature": "nope"})
    url = reverse("admin:journal_execution_changelist")
    page = admin_client.get(url).content.decode()
    assert "tests.fixtures.queue_flows.shout" in page
    filtered = admin_client.get(url, {"flow": "tests.fixtures.queue_flows.shout"}).content.decode()
    assert result.id in filtered and "?flow=tests.fixtures.queue_flows.shout" in page
    out = io.StringIO()
    call_command("loom", "executions", "list", "--flow", "tests.fixtures.queue_flows.shout", "--json", stdout=out)
    rows = {row["id"]: row for row in json.loads(out.getvalue())}
    assert rows[result.id]["task"] == "tests.fixtures.queue_flows.shout" and rows[result.id]["flow"] == "loom.task"
    assert rows[forged.id]["task"] is None  # a path that does not verify is not shown as a task
    out = io.StringIO()
    call_command("loom", "executions", "list", "--flow", "tests.fixtures.queue_flows.shout", stdout=out)
    line = next(line for line in out.getvalue().splitlines() if line.startswith(result.id))
    assert "tests.fixtures.queue_flows.shout" in line


def test_an_entry_of_an_earlier_release_without_a_header_is_still_read():
    """Before a1's change an entry holds the input and no header exists until a worker begins it."""
    result = queue_flows.add.enqueue(3, 4)
    assert QueueEntry.objects.filter(execution_id=result.id).exists()
    assert queue_flows.add.get_result(result.id).args == [3, 4]


def test_an_operators_retry_of_a_failed_task_runs_it_again_with_fresh_attempts():
    """The same execution id: its signature still verifies (docs/queues.md)."""
    from journal.flows import retry_execution

    queue_flows.FLAKY_CALLS.clear()
    queue_flows.FLAKY_CALLS["r"] = 0
    result = queue_flows.flaky.enqueue("r")  # one attempt (the default ATTEMPTS): its first call fails
    assert work() == ["failed"]
    assert retry_execution(result.id).status == "completed"
    fetched = queue_flows.flaky.get_result(result.id)
    assert fetched.status == TaskResultStatus.SUCCESSFUL and queue_flows.FLAKY_CALLS["r"] == 2
    assert [e.exception_class_path for e in fetched.errors] == ["builtins.RuntimeError"]


def test_a_task_an_earlier_release_left_running_goes_on_from_its_recorded_attempts():
    """An earlier release journaled each failed attempt as a completed step {"ok": false} at its own position:
    a resume under this release counts them, runs only the attempts left, and reads their errors."""
    from journal.flows import events as ev
    from journal.flows import resume
    from queues.tasks import sign_task

    path = queue_flows.flaky.module_path
    queue_flows.FLAKY_CALLS.clear()
    queue_flows.FLAKY_CALLS["old"] = 1  # its first attempt ran (and failed) under the earlier release
    data = {"task": path, "signature": sign_task("t-old-1", path), "args": ["old"], "kwargs": {},
            "takes_context": True, "attempts": 3}
    error = {"exception_class_path": "builtins.RuntimeError", "traceback": "Traceback ...\\nRuntimeError: first"}
    from journal.envelopes import Envelope
    from journal.models import Event

    token, _ = Event.objects.open_stream("t-old-1", Envelope(ev.EXECUTION_STARTED, {"flow": "loom.task",
                                                                                     "input": data}))
    if not Execution.objects.filter(pk="t-old-1").exists():
        Execution.objects.create(id="t-old-1", flow="loom.task", status="running", input=data)
    Event.objects.append("t-old-1", [
        Envelope(ev.STEP_STARTED, {"step": "call", "pos": 0, "attempt": 1}),
        Envelope(ev.STEP_COMPLETED, {"step": "call", "pos": 0, "attempt": 1, "ms": 1, "result": {
            "ok": False, "error": error, "worker": "w0", "attempt": 1}})], fence_token=token)
    assert resume("t-old-1", force=True).status == "completed"  # its worker died (an operator forces it)
    fetched = queue_flows.flaky.get_result("t-old-1")
    assert fetched.status == TaskResultStatus.SUCCESSFUL and queue_flows.FLAKY_CALLS["old"] == 2
    assert [e.exception_class_path for e in fetched.errors] == ["builtins.RuntimeError"]
    assert fetched.worker_ids[0] == "w0" and fetched.attempts == 2


def test_bytes_follow_djangos_json_rule_utf8_becomes_str_and_other_bytes_are_refused():
    """Django's normalize_json decodes UTF-8 bytes; others were a raw UnicodeDecodeError/ValueError path."""
    before = QueueEntry.objects.count()
    with pytest.raises(InvalidTaskArguments):
        queue_flows.add.enqueue(b"\x80", 1)
    assert QueueEntry.objects.count() == before
    assert queue_flows.add.enqueue(b"ab", b"c").args == ["ab", "c"]
