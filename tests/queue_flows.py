"""Flows and Django tasks of the queue tests, in a module that worker processes import
(LOOM_FLOW_MODULES=tests.queue_flows). Imported by test modules after Django is set up."""

from __future__ import annotations

import time

from journal.flows import flow
from queues.tasks import retry

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task


@flow("queues.test.double")
def double(ctx, value):
    return ctx.step("double", lambda: value["n"] * 2)


@flow("queues.test.nap")
def nap(ctx, value):
    """One step that sleeps: long enough for a sampler to see the queue at its cap."""
    return ctx.step("nap", time.sleep, value.get("seconds", 0.2))


@flow("queues.test.session")
def session(ctx, value):
    """One step that answers the database session it ran on (PostgreSQL's backend pid of this thread's
    connection): which sessions a dispatcher's runner threads hold."""
    return ctx.step("pid", _backend_pid)


def _backend_pid() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


@task
def add(a: int, b: int) -> int:
    return a + b


@task(priority=5)
def shout(text: str) -> str:
    return text.upper()


@task
def explode(message: str) -> None:
    raise ValueError(message)


FLAKY_CALLS: dict[str, int] = {}


@task(takes_context=True)
def flaky(context, key: str) -> int:
    """Fails on its first attempt, succeeds on the next: returns the attempt number from its context."""
    FLAKY_CALLS[key] = FLAKY_CALLS.get(key, 0) + 1
    if FLAKY_CALLS[key] == 1:
        raise RuntimeError(f"first attempt of {key}")
    return context.attempt


@task
async def asleep(n: int) -> int:
    return n + 1


@task
def unreturnable() -> object:
    return object()


@flow("queues.test.inbox")
def inbox(ctx, value):
    """Waits for a message on "go" (sent while it was still queued: messages wait for it), publishes it as
    the event "got" and returns it."""
    message = ctx.recv("go", timeout=value.get("timeout", 5))
    ctx.set_event("got", message)
    return message


@task
def exits(code: int) -> None:
    """Raises SystemExit, as a task calling sys.exit() would."""
    raise SystemExit(code)


@task
def interrupted() -> None:
    raise KeyboardInterrupt("stop")


@task(takes_context=True)
def who_runs_me(context) -> dict:
    """What get_result says of this task while it runs (read from the database, as another process would)."""
    seen = context.task_result.task.get_backend().get_result(context.task_result.id)
    return {"status": str(seen.status), "worker_ids": seen.worker_ids, "attempts": seen.attempts}


@task
@retry(attempts=2, backoff=3600.0)
def patient(message: str) -> None:
    """Fails; its own policy waits an hour before its second attempt."""
    raise ValueError(message)


@task
def complex_exception() -> None:
    raise ValueError(ValueError("This task failed"))
