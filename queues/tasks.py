"""A Django Tasks backend whose tasks are durable executions on Loom's queues.

    TASKS = {"default": {"BACKEND": "queues.tasks.LoomBackend", "QUEUES": ["default", "emails"],
                         "OPTIONS": {"ATTEMPTS": 3, "CONCURRENCY": 10}}}

`task.enqueue(...)` queues an execution of the flow "loom.task" (queues.enqueue: priority, queue_name
and run_after become the entry's priority, queue and not-before time); a loom_worker claims it within
its queue's caps and runs the task function in a journaled step, leased like any run: a worker killed
mid-task leaves a running execution that the recovery sweep resumes elsewhere. `get_result(id)` reads
the execution (the result id IS the execution id). Works with `django.tasks` (Django 6) and with the
`django_tasks` backport (Django 5.2). Needs the `queues` app installed (docs/queues.md). Its old path
`journal.tasks.LoomBackend` still works, deprecated (journal/tasks/__init__.py).

Attempts: one journaled step "call" whose retry policy is the task's (OPTIONS ATTEMPTS, BACKOFF,
BACKOFF_FACTOR, MAX_BACKOFF; `retry` under @task per task): each failed attempt, any BaseException but
GeneratorExit, is a STEP_FAILED with the class path, message, traceback and worker (Django's TaskError is read
from it); a long backoff parks the execution on a timer. After the last the execution fails and the result is
FAILED with every error. A completed attempt never runs again.

Async (`await task.aenqueue(...)`, `await task.aget_result(id)`, `await result.arefresh()`): Django's own
BaseTaskBackend.aenqueue/aget_result, `sync_to_async(thread_sensitive=True)` of enqueue/get_result, kept on
purpose: neither waits (one short transaction or read), so it costs the request's own thread-sensitive thread,
the one its async ORM calls use under ASGI, and never touches the database on the loop; and in a TestCase's
async test it runs in the test's thread and transaction, as Django's own Tasks tests require
(tests/queues/test_tasks_conformance.py). The journal's bounded pool (journal.flows.aio) would commit outside
that transaction. Tested from async views: tests/queues/test_queues_async.py.

Only a task path LoomBackend.enqueue signed for the execution is imported (journal/task_names.py): a start of
loom.task made any other way fails with UnverifiedTask, before any import.
"""

from __future__ import annotations

import contextlib
import logging
import traceback
from dataclasses import replace
from datetime import datetime
from typing import Any

from django.apps import apps
from django.db import router
from django.utils import timezone
from django.utils.module_loading import import_string

from journal import shards
from journal.checks import honour_former_ids, renamed
from journal.flows import InvalidInput, flow
from journal.flows import events as ev
from journal.flows.errors import StepFailed
from journal.flows.retry import RetryPolicy
from journal.identity import node_identity
from journal.ids import id_problem, stored_id_problem
from journal.task_names import TASK_FLOW, UnverifiedTask, sign_task, verified_path
from queues import conf
from queues.declarations import MAX_NAME, declare_queue, declared
from queues.store.base import decode

try:  # Django 6: the Tasks framework is part of Django
    from django.tasks import TaskContext, TaskResult, TaskResultStatus
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import TaskContext, TaskResult, TaskResultStatus
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import TaskError
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued, task_finished, task_started
    from django_tasks.utils import normalize_json

log = logging.getLogger("loom.tasks")
renamed({"loom.E301": ("loom.E130",)})  # the backend's check id, in queues' range of loom.* (docs/configuration.md)
MAX_TRACEBACK = 20_000  # characters of a traceback kept in the journal


class InvalidTaskArguments(InvalidInput, InvalidTask, TypeError):
    """A task's arguments are not JSON the journal stores (journal/jsonvalues.py); nothing was queued. A
    TypeError too, as Django's own backends raise for arguments outside JSON."""


class TaskFailed(Exception):
    """Every attempt of a task raised; the execution fails naming the last exception's class and message."""

    def __init__(self, error: str) -> None:
        super().__init__(error)
        self.journal_error = error  # the header's error: "builtins.ValueError: boom", no "TaskFailed:" before it


class TaskAttemptFailed(Exception):
    """One attempt of a task raised (any BaseException but GeneratorExit): the step's failed attempt, recorded
    with the exception's class path and message (its error) and its traceback and worker (journal_fields)."""

    def __init__(self, exc: BaseException, worker: str) -> None:
        kind = type(exc)
        self.class_path = f"{kind.__module__}.{kind.__qualname__}"
        message = " ".join(str(exc).split())
        self.journal_error = f"{self.class_path}: {message}" if message else self.class_path
        self.journal_fields = {"exception_class_path": self.class_path, "worker": worker,
                               "traceback": "".join(traceback.format_exception(exc))[-MAX_TRACEBACK:]}
        super().__init__(self.journal_error)


def _task_of(path: str):
    """The Task object a verified module path names (the @task-decorated function)."""
    task = import_string(path)
    if not hasattr(task, "func") or not hasattr(task, "module_path"):
        raise TypeError(f"{path!r} is not a task (decorate it with @task)")
    return task


def retry(*, backoff: float | None = None, factor: float | None = None, max_backoff: float | None = None,
          attempts: int | None = None):
    """Per task: the wait between its attempts (and their number), over the backend's OPTIONS. Put it under
    @task:  @task  @retry(attempts=5, backoff=2.0)  def f(): ...  (waits 2, 4, 8, 16 s; max_backoff caps)."""
    options = {"attempts": attempts, "backoff": backoff, "factor": factor, "max_backoff": max_backoff}
    RetryPolicy(**{k: v for k, v in options.items() if v is not None})  # an unusable policy: ValueError here

    def mark(func):
        func.loom_retry = {k: v for k, v in options.items() if v is not None}
        return func
    return mark


def call_task(input: dict, execution_id: str) -> dict:
    """One attempt: call the task function; its return value and worker, or TaskAttemptFailed (the step's retry
    policy runs the next attempt). Any BaseException of the task but GeneratorExit (SystemExit,
    KeyboardInterrupt) is a failed attempt, as in django-tasks-db's db_worker. Sends Django's task_started, and
    task_finished once the task has succeeded or its last attempt failed (again if a crash makes the attempt run
    again: the signals are at least once)."""
    from queues.service import (
        worker_id,  # app registry: imports models; this backend loads at a @task
    )

    worker = worker_id() or node_identity()
    current = None
    try:
        task = _task_of(verified_path(input, execution_id))
        args, kwargs = input.get("args") or [], input.get("kwargs") or {}
        current = _running(task, execution_id, worker)
        if input.get("takes_context"):
            if current is None:
                raise RuntimeError(f"the context of task {execution_id} could not be read")
            value = task.call(TaskContext(task_result=current), *args, **kwargs)
        else:
            value = task.call(*args, **kwargs)
        value = normalize_json(value)  # Django's contract: the return value is JSON (TypeError if not)
        from journal import jsonvalues

        problem = jsonvalues.problem(value, "return value")
        if problem is not None:
            raise TypeError(problem)
    except GeneratorExit:
        raise
    except BaseException as exc:  # SystemExit, KeyboardInterrupt: a failed attempt, not an exit
        failed = TaskAttemptFailed(exc, worker)
        if current is not None and current.attempts >= int(input.get("attempts") or 1):
            task_finished.send(type(current.task.get_backend()), task_result=replace(
                current, status=TaskResultStatus.FAILED, finished_at=timezone.now(),
                errors=[*current.errors, TaskError(exception_class_path=failed.class_path,
                                                  traceback=failed.journal_fields["traceback"])]))
        raise failed from None
    if current is not None:
        done = replace(current, status=TaskResultStatus.SUCCESSFUL, finished_at=timezone.now())
        object.__setattr__(done, "_return_value", value)
        task_finished.send(type(current.task.get_backend()), task_result=done)
    return {"ok": True, "value": value, "worker": worker}


def _running(task, execution_id: str, worker: str):
    """The task's result as it starts this attempt (this worker's), after sending task_started; None if it
    cannot be read (the signals and the context then go without it: they never fail the task)."""
    backend = task.get_backend()
    if not isinstance(backend, LoomBackend):
        return None
    try:
        current = backend.get_result(execution_id)
        current = replace(current, status=TaskResultStatus.RUNNING, worker_ids=[*current.worker_ids[:-1], worker])
    except Exception:
        log.exception("task %s: its result could not be read for the task_started signal", execution_id)
        return None
    task_started.send(type(backend), task_result=current)
    return current


def policy_of(input: dict) -> RetryPolicy:
    """The attempts and backoff a task was enqueued with (its input), as the call step's retry policy."""
    options = {key: input[key] for key in ("backoff", "factor", "max_backoff") if input.get(key) is not None}
    return RetryPolicy(max(1, int(input.get("attempts") or 1)), retry_on=(TaskAttemptFailed,), **options)


@flow(TASK_FLOW)
def run_task(ctx, input: dict):
    """A Django task as a durable execution: one journaled step "call" whose attempts are the task's."""
    verified_path(input, ctx.execution_id)  # before anything is imported: refused, the execution fails
    policy, earlier = policy_of(input), 0
    while True:
        try:
            record = ctx.step("call", call_task, input, ctx.execution_id,
                              retry=replace(policy, attempts=max(1, policy.attempts - earlier)))
        except StepFailed as failed:
            attempts = earlier + failed.attempts
            raise TaskFailed(f"{failed.error}" + (f" (after {attempts} attempts)" if attempts > 1 else "")) from None
        if record.get("ok") or not isinstance(record.get("error"), dict):
            return record.get("value")
        # An attempt an earlier release recorded as a completed step {"ok": false}: it took one position each.
        earlier += 1
        if earlier >= policy.attempts:
            raise TaskFailed(str(record["error"].get("exception_class_path", "unknown")))


def _aware(text: str | None) -> datetime | None:
    return None if not text else datetime.fromisoformat(text)


# "waiting" (a flow parked in a sleep or a receive, or a task between attempts on a parked backoff): running.
STATUS_OF_HEADER = {"running": TaskResultStatus.RUNNING, "suspended": TaskResultStatus.RUNNING,
                    "waiting": TaskResultStatus.RUNNING, "queued": TaskResultStatus.READY,
                    "completed": TaskResultStatus.SUCCESSFUL, "failed": TaskResultStatus.FAILED,
                    "cancelled": TaskResultStatus.FAILED, "stuck": TaskResultStatus.FAILED}
STATUS_OF_ENTRY = {"pending": TaskResultStatus.READY, "started": TaskResultStatus.RUNNING,
                   "done": TaskResultStatus.FAILED, "cancelled": TaskResultStatus.FAILED}


def attempts_of(events) -> tuple[list[dict], bool, Any]:
    """The task's attempts from its journal: one {worker, at, error} per attempt that ran (error None: it
    succeeded), whether the last is still running, and the return value. Reads the STEP_FAILED of each failed
    attempt, and the completed steps an earlier release wrote (one per attempt, {"ok": false, "error": ...})."""
    attempts: list[dict] = []
    running, value, open_at = False, None, None
    for event in events:
        p = event.payload if isinstance(event.payload, dict) else {}
        if p.get("step") != "call":
            continue
        if event.type == ev.STEP_STARTED:
            running, open_at = True, event.recorded_at
        elif event.type == ev.STEP_FAILED:
            error = TaskError(exception_class_path=str(p.get("exception_class_path") or _class_of(p.get("error"))),
                              traceback=str(p.get("traceback") or p.get("error") or ""))
            attempts.append({"worker": str(p.get("worker") or ""), "at": open_at, "error": error})
            running = False
        elif event.type == ev.STEP_COMPLETED and isinstance(p.get("result"), dict):
            record = p["result"]
            error = record.get("error") if not record.get("ok") else None
            attempts.append({"worker": str(record.get("worker") or ""), "at": _aware(record.get("at")) or open_at,
                             "error": TaskError(**error) if isinstance(error, dict) else None})
            running = False
            if record.get("ok"):
                value = record.get("value")
    return attempts, running, value


def _class_of(error: Any) -> str:
    """The class path at the head of a STEP_FAILED error ("builtins.ValueError: boom")."""
    text = error if isinstance(error, str) else ""
    return text.split(":", 1)[0].split()[0] if text.strip() else "builtins.Exception"


class LoomBackend(BaseTaskBackend):
    """Tasks as durable executions on Loom's queues, run by loom_worker (leases, recovery, attempts)."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict) -> None:
        super().__init__(alias, params)
        self.database = self.options.get("DATABASE")  # None: the router's alias of the queue tables
        self.attempts = int(self.options.get("ATTEMPTS", 1))
        self.backoff = {key: self.options[option] for key, option in
                        (("backoff", "BACKOFF"), ("factor", "BACKOFF_FACTOR"), ("max_backoff", "MAX_BACKOFF"))
                        if self.options.get(option) is not None}
        RetryPolicy(max(1, self.attempts), **self.backoff)  # ValueError at startup for an unusable policy
        self.concurrency = self.options.get("CONCURRENCY")
        if not apps.apps_ready or apps.is_installed("queues"):  # (a @task module imported while apps load)
            self._declare_queues(self.queues)

    def _declare_queues(self, names) -> None:
        """Queues named here but declared nowhere get the backend's (or the default) cap."""

        known = declared()
        cap = self.concurrency if self.concurrency is not None else conf.get("LOOM_QUEUE_DEFAULT_CONCURRENCY")
        for name in sorted(names):
            if name not in known:
                declare_queue(name, cap)

    def check(self, **kwargs: Any) -> list:
        """Django's checks of the backend, and the queues app this backend needs (as DatabaseBackend asks for
        its app): an error with the hint, not a RuntimeError at the first enqueue."""
        from django.core import checks

        problems = list(super().check(**kwargs))
        if not apps.is_installed("queues"):
            problems.append(checks.Error(f"{type(self).__name__} (TASKS[{self.alias!r}]) needs the queues app",
                                         hint="Insert 'queues' in INSTALLED_APPS (docs/queues.md)",
                                         id="loom.E301"))
        return honour_former_ids(problems)

    def validate_task(self, task) -> None:
        """Django's rules, and a queue name Loom can store (else InvalidTask, as for a name outside QUEUES)."""
        super().validate_task(task)

        name = task.queue_name
        problem = id_problem(name) if isinstance(name, str) else "a queue name is a str"
        if problem is None and len(name) > MAX_NAME:
            problem = f"at most {MAX_NAME} characters"
        if problem is not None:
            raise InvalidTask(f"queue name {name!r}: {problem}")

    def _alias(self, result_id: str | None = None) -> str | None:
        """The database of the queue tables: OPTIONS["DATABASE"], else the router's alias; with LOOM_SHARDS
        an execution's shard (None before its id exists: queues.enqueue places the entry on its shard)."""
        from queues.models import QueueEntry  # app registry (this backend can load before apps are ready)

        if self.database:
            return self.database
        if shards.sharded():
            return None if result_id is None else shards.shard_for(result_id)
        return router.db_for_write(QueueEntry)

    def enqueue(self, task, args, kwargs):
        from ulid import ULID

        from queues import enqueue

        if not apps.is_installed("queues"):
            raise InvalidTask(f"{type(self).__name__} needs the queues app: insert 'queues' in INSTALLED_APPS")
        self.validate_task(task)
        try:  # Django's rule first (tuples become lists, UTF-8 bytes str; TypeError "Unsupported type" else)
            args, kwargs = normalize_json(list(args)), normalize_json(dict(kwargs))
        except (TypeError, ValueError) as exc:  # ValueError: bytes that are not UTF-8
            raise InvalidTaskArguments(f"arguments of task {task.module_path}: {exc}") from None
        if not self.queues:  # QUEUES = []: any queue name (Django's rule); an undeclared one gets the default cap
            self._declare_queues([task.queue_name])
        execution_id = str(ULID())
        policy = {"attempts": self.attempts, **self.backoff, **getattr(task.func, "loom_retry", {})}
        input = {"task": task.module_path, "signature": sign_task(execution_id, task.module_path),
                 "args": list(args), "kwargs": dict(kwargs), "takes_context": task.takes_context, **policy}
        try:
            queued = enqueue(TASK_FLOW, input, queue=task.queue_name, priority=task.priority,
                             run_after=task.run_after, using=self._alias(), execution_id=execution_id)
        except InvalidInput as exc:
            raise InvalidTaskArguments(f"arguments of task {task.module_path}: {exc}") from None
        result = self._read(queued.execution_id, task)  # the rows' own times: equal to get_result's
        if queued.created:
            task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id):
        if stored_id_problem(result_id) is not None:  # NUL, lone surrogate, empty, too long: no such result
            raise TaskResultDoesNotExist(repr(result_id))
        return self._read(result_id)

    def _read(self, result_id: str, task=None):
        """The result from the execution's rows: its queue entry, its header and its journal. The task path is
        imported only once its signature is verified."""
        from journal.models import Event, Execution  # app registry (as above)
        from queues.models import QueueEntry  # app registry (as above)

        alias = self._alias(result_id)  # the entry and the header live on the execution's shard
        entry = QueueEntry.objects.using(alias).filter(execution_id=result_id).first()
        header = Execution.objects.using(alias).filter(pk=result_id).first()
        flow_name = header.flow if header is not None else entry.flow if entry is not None else None
        if flow_name != TASK_FLOW:
            raise TaskResultDoesNotExist(result_id)
        input = header.input if header is not None else decode(entry.input)  # the entry: rows of an older release
        try:
            path = verified_path(input, result_id)
        except UnverifiedTask as exc:
            raise TaskResultDoesNotExist(str(exc)) from None
        if task is None:
            try:
                task = _task_of(path)
            except (ImportError, AttributeError, TypeError) as exc:
                raise TaskResultDoesNotExist(f"{result_id}: its task cannot be imported ({exc})") from None
        if entry is not None:
            # A queue this process's backend does not list keeps the task as declared.
            with contextlib.suppress(InvalidTask):
                task = task.using(priority=entry.priority, queue_name=entry.queue_id)
        if task.run_after is None and entry is not None and entry.run_after > entry.enqueued_at:
            with contextlib.suppress(InvalidTask):
                task = task.using(run_after=entry.run_after)  # a deferred task: its not-before time
        began = header is not None and header.status != "queued"
        attempts, running, value = attempts_of(Event.objects.read(result_id)) if began else ([], False, None)
        if header is not None and not (header.status == "queued" and entry is not None):
            status = STATUS_OF_HEADER.get(header.status, TaskResultStatus.RUNNING)
        else:  # not begun yet: the entry says whether a worker claimed it (RUNNING, as Django's backends say)
            status = STATUS_OF_ENTRY[entry.state]
        workers = [a["worker"] for a in attempts]
        if status == TaskResultStatus.RUNNING and (running or not attempts):
            workers.append(entry.worker if entry is not None and entry.worker else node_identity())
        started = entry.begun_at or entry.started_at if entry is not None else None
        started = started or (header.created_at if began else None)
        attempted = [a["at"] for a in attempts if a["at"] is not None]
        result = TaskResult(
            task=task, id=result_id, status=status,
            enqueued_at=entry.enqueued_at if entry is not None else header.created_at,
            started_at=started if status != TaskResultStatus.READY else None,
            finished_at=header.finished_at if header is not None else (entry.finished_at if entry else None),
            last_attempted_at=attempted[-1] if attempted else (started if status != TaskResultStatus.READY else None),
            args=input.get("args") or [], kwargs=input.get("kwargs") or {}, backend=self.alias,
            errors=[a["error"] for a in attempts if a["error"] is not None], worker_ids=workers)
        if status == TaskResultStatus.SUCCESSFUL:
            object.__setattr__(result, "_return_value", header.result if value is None else value)
        return result
