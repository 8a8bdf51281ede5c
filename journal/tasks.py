"""A Django Tasks backend whose tasks are durable executions on Loom's queues.

    TASKS = {"default": {"BACKEND": "journal.tasks.LoomBackend", "QUEUES": ["default", "emails"],
                         "OPTIONS": {"ATTEMPTS": 3, "CONCURRENCY": 10}}}

`task.enqueue(...)` queues an execution of the flow "loom.task" (queues.enqueue: priority, queue_name
and run_after become the entry's priority, queue and not-before time); a loom_worker claims it within
its queue's caps and runs the task function in a journaled step, leased like any run: a worker killed
mid-task leaves a running execution that the recovery sweep resumes elsewhere. `get_result(id)` reads
the execution (the result id IS the execution id). Works with `django.tasks` (Django 6) and with the
`django_tasks` backport (Django 5.2). Needs the `queues` app installed (docs/queues.md).

Attempts: OPTIONS["ATTEMPTS"] (default 1) calls of the function, each a journaled step; an exception
is recorded (class path and traceback, Django's TaskError) and the next attempt runs; after the last
the execution fails and the result is FAILED with every error. A completed attempt never runs again.
"""

from __future__ import annotations

import contextlib
import logging
import traceback
from dataclasses import replace
from datetime import datetime
from typing import Any

from django.db import router
from django.utils import timezone
from django.utils.module_loading import import_string

from journal.flows import InvalidInput, flow
from journal.identity import node_identity
from journal.ids import stored_id_problem

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

TASK_FLOW = "loom.task"
log = logging.getLogger("loom.tasks")
MAX_TRACEBACK = 20_000  # characters of a traceback kept in the log


class InvalidTaskArguments(InvalidInput, InvalidTask):
    """A task's arguments are not JSON the journal stores (journal/jsonvalues.py); nothing was queued."""


class TaskFailed(Exception):
    """Every attempt of a task raised; the execution fails with the last exception's class."""


def _task_of(path: str):
    """The Task object a module path names (the @task-decorated function)."""
    task = import_string(path)
    if not hasattr(task, "func") or not hasattr(task, "module_path"):
        raise TypeError(f"{path!r} is not a task (decorate it with @task)")
    return task


def call_task(input: dict, attempt: int, execution_id: str) -> dict:
    """One attempt: call the task function; what happened, as a journaled step result. Sends Django's
    task_started, and task_finished once the task has succeeded or its last attempt failed (again if a
    crash makes the attempt run again: the signals are at least once)."""
    from queues.service import worker_id

    record: dict[str, Any] = {"worker": worker_id() or node_identity(), "at": timezone.now().isoformat(),
                              "attempt": attempt}
    current = None
    try:
        task = _task_of(input["task"])
        args, kwargs = input.get("args") or [], input.get("kwargs") or {}
        current = _running(task, execution_id, record["worker"])
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
    except Exception as exc:
        kind = type(exc)
        error = {"exception_class_path": f"{kind.__module__}.{kind.__qualname__}",
                 "traceback": "".join(traceback.format_exception(exc))[-MAX_TRACEBACK:]}
        record.update(ok=False, error=error)
        if current is not None and attempt >= int(input.get("attempts") or 1):
            task_finished.send(type(current.task.get_backend()), task_result=replace(
                current, status=TaskResultStatus.FAILED, finished_at=timezone.now(),
                errors=[*current.errors, TaskError(**error)]))
        return record
    record.update(ok=True, value=value)
    if current is not None:
        done = replace(current, status=TaskResultStatus.SUCCESSFUL, finished_at=timezone.now())
        object.__setattr__(done, "_return_value", value)
        task_finished.send(type(current.task.get_backend()), task_result=done)
    return record


def _running(task, execution_id: str, worker: str):
    """The task's result as it starts this attempt, after sending task_started; None if it cannot be
    read (the signals and the context then go without it: they never fail the task)."""
    backend = task.get_backend()
    if not isinstance(backend, LoomBackend):
        return None
    try:
        current = backend.get_result(execution_id)
        current = replace(current, status=TaskResultStatus.RUNNING, last_attempted_at=timezone.now(),
                          worker_ids=[*current.worker_ids, worker])
    except Exception:
        log.exception("task %s: its result could not be read for the task_started signal", execution_id)
        return None
    task_started.send(type(backend), task_result=current)
    return current


@flow(TASK_FLOW)
def run_task(ctx, input: dict):
    """A Django task as a durable execution: up to `attempts` journaled calls of its function."""
    attempts = max(1, int(input.get("attempts") or 1))
    record: dict = {}
    for attempt in range(1, attempts + 1):
        record = ctx.step("call", call_task, input, attempt, ctx.execution_id)
        if record.get("ok"):
            return record.get("value")
    raise TaskFailed(record.get("error", {}).get("exception_class_path", "unknown"))


def _aware(text: str | None) -> datetime | None:
    return None if not text else datetime.fromisoformat(text)


# "waiting" (a flow parked in a sleep or a receive; the flows-that-wait issue adds that status): running.
STATUS_OF_HEADER = {"running": TaskResultStatus.RUNNING, "suspended": TaskResultStatus.RUNNING,
                    "waiting": TaskResultStatus.RUNNING,
                    "completed": TaskResultStatus.SUCCESSFUL, "failed": TaskResultStatus.FAILED,
                    "cancelled": TaskResultStatus.FAILED, "stuck": TaskResultStatus.FAILED}
STATUS_OF_ENTRY = {"pending": TaskResultStatus.READY, "started": TaskResultStatus.RUNNING,
                   "done": TaskResultStatus.FAILED, "cancelled": TaskResultStatus.FAILED}


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
        self._declare_queues(self.options.get("CONCURRENCY"))

    def _declare_queues(self, concurrency: int | None) -> None:
        """Queues named in QUEUES but declared nowhere get the backend's (or the default) cap."""
        from queues import conf
        from queues.declarations import declare_queue, declared

        known = declared()
        cap = concurrency if concurrency is not None else conf.get("LOOM_QUEUE_DEFAULT_CONCURRENCY")
        for name in sorted(self.queues):
            if name not in known:
                declare_queue(name, cap)

    def _alias(self, result_id: str | None = None) -> str | None:
        """The database of the queue tables: OPTIONS["DATABASE"], else the router's alias; with LOOM_SHARDS
        an execution's shard (None before its id exists: queues.enqueue places the entry on its shard)."""
        from journal import shards
        from queues.models import QueueEntry

        if self.database:
            return self.database
        if shards.sharded():
            return None if result_id is None else shards.shard_for(result_id)
        return router.db_for_write(QueueEntry)

    def enqueue(self, task, args, kwargs):
        from queues import enqueue

        self.validate_task(task)
        input = {"task": task.module_path, "args": list(args), "kwargs": dict(kwargs),
                 "takes_context": task.takes_context, "attempts": self.attempts}
        try:
            queued = enqueue(TASK_FLOW, input, queue=task.queue_name, priority=task.priority,
                             run_after=task.run_after, using=self._alias())
        except InvalidInput as exc:
            raise InvalidTaskArguments(f"arguments of task {task.module_path}: {exc}") from None
        result = TaskResult(task=task, id=queued.execution_id, status=TaskResultStatus.READY,
                            enqueued_at=timezone.now(), started_at=None, finished_at=None, last_attempted_at=None,
                            args=list(args), kwargs=dict(kwargs), backend=self.alias, errors=[], worker_ids=[])
        if queued.created:
            task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id):
        from journal.flows.state import load_state
        from journal.models import Execution
        from queues.models import QueueEntry

        if stored_id_problem(result_id) is not None:  # NUL, lone surrogate, empty, too long: no such result
            raise TaskResultDoesNotExist(repr(result_id))
        alias = self._alias(result_id)  # the entry and the header live on the execution's shard
        entry = QueueEntry.objects.using(alias).filter(execution_id=result_id).first()
        header = Execution.objects.using(alias).filter(pk=result_id).first()
        flow_name = header.flow if header is not None else entry.flow if entry is not None else None
        if flow_name != TASK_FLOW:
            raise TaskResultDoesNotExist(result_id)
        from queues.store.base import decode

        input = header.input if header is not None else decode(entry.input)
        try:
            task = _task_of(input["task"])
        except (ImportError, AttributeError, TypeError, KeyError) as exc:
            raise TaskResultDoesNotExist(f"{result_id}: its task cannot be imported ({exc})") from None
        if entry is not None:
            # A queue this process's backend does not list keeps the task as declared.
            with contextlib.suppress(InvalidTask):
                task = task.using(priority=entry.priority, queue_name=entry.queue_id)
        records = []
        if header is not None:
            records = [step[2] for step in load_state(result_id).steps
                       if step[0] == "call" and step[1] == "completed" and isinstance(step[2], dict)]
        status = STATUS_OF_HEADER.get(header.status) if header is not None else STATUS_OF_ENTRY[entry.state]
        errors = [TaskError(**r["error"]) for r in records if not r.get("ok") and isinstance(r.get("error"), dict)]
        attempted = [_aware(r.get("at")) for r in records]
        started = header.created_at if header is not None else (entry.started_at if entry is not None else None)
        result = TaskResult(
            task=task, id=result_id, status=status,
            enqueued_at=entry.enqueued_at if entry is not None else (header.created_at if header else None),
            started_at=started if status != TaskResultStatus.READY else None,
            finished_at=header.finished_at if header is not None else (entry.finished_at if entry else None),
            last_attempted_at=attempted[-1] if attempted else started,
            args=input.get("args") or [], kwargs=input.get("kwargs") or {}, backend=self.alias,
            errors=errors, worker_ids=[r.get("worker", "") for r in records])
        if status == TaskResultStatus.SUCCESSFUL:
            object.__setattr__(result, "_return_value", header.result)
        return result
