"""Flows used by tests/leases/test_leases*.py, importable by child processes (LOOM_FLOW_MODULES)."""

from __future__ import annotations

import os
import time

from django.db import connection

from journal.flows import flow

EFFECTS = "test_lease_effects"


def create_effects_table() -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE IF NOT EXISTS {EFFECTS} (execution_id varchar(200), step varchar(50),"
                       " pid integer)")


def effects() -> list[tuple[str, str]]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT execution_id, step FROM {EFFECTS} ORDER BY execution_id, step")
        return [tuple(r) for r in cursor.fetchall()]


def record(execution_id: str, step: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {EFFECTS} (execution_id, step, pid) VALUES (%s, %s, %s)",
                       [execution_id, step, os.getpid()])
    return step


@flow("leases.noop")
def noop(ctx, value):
    return ctx.step("noop", lambda: 1)


@flow("leases.sleepy")
def sleepy(ctx, value):
    """One step that lasts `seconds` (longer than the lazy grace: the run must take a lease)."""
    return ctx.step("sleep", lambda: time.sleep(value["seconds"]) or value["seconds"])


@flow("leases.steps")
def steps(ctx, value):
    """`n` atomic steps, each recording its effect and lasting `pause` seconds: a crash mid-step
    rolls the effect back with the step, so every completed step's effect exists exactly once."""
    eid = ctx.execution_id

    def one(i: int) -> int:
        record(eid, f"s{i:03d}")
        time.sleep(value["pause"])
        return i

    for i in range(value["n"]):
        ctx.step(f"s{i:03d}", one, i, atomic=True)
    return value["n"]


@flow("leases.gated")
def gated(ctx, value):
    """Step `wait` signals that it runs (a marker file per process) and waits for the `release`
    file; it returns the pid that ran it, so the journal says which process completed it."""

    def wait() -> int:
        with open(f"{value['marker']}.{os.getpid()}", "w") as fh:
            fh.write("running")
        deadline = time.monotonic() + 60
        while not os.path.exists(value["release"]) and time.monotonic() < deadline:
            time.sleep(0.02)
        return os.getpid()

    ctx.step("first", lambda: 1)
    who = ctx.step("wait", wait)
    ctx.step("after", lambda: 3)
    return who


def queue_old_scheme_start(flow_name: str, input, execution_id: str, meta: dict | None = None) -> None:
    """What a start queued before issue #24 left behind (leases.tasks.reserve_and_enqueue, removed): a
    reservation row of its id and a django-q2 task `leases.tasks.run_start` with the input (marked fields
    sealed), in one transaction; the migration path's tests deliver such tasks after the upgrade."""
    from django.db import transaction
    from django_q.tasks import async_task

    from journal import shards
    from journal.flows import get_flow
    from journal.flows.runtime import seal_started
    from leases.store import store_for
    from leases.tasks import _alias, _starter, input_hash

    _, stored = get_flow(flow_name).prepare(input)
    with shards.on_stream(execution_id):
        sealed = seal_started(flow_name, stored)
    with transaction.atomic(using=_alias()):
        store_for(_alias()).reserve_start(execution_id, flow_name, input_hash(stored), _starter(meta))
        async_task("leases.tasks.run_start", flow_name, sealed, execution_id, meta,
                   task_name=f"start {flow_name} {execution_id}"[:100], q_options={"timeout": -1})


def handed_over() -> list[dict]:
    """The hand-overs waiting for a worker (issue #24: resume entries on the execution's queue, no longer
    django-q2 tasks), oldest first: func "resume", args (execution id, fence handed over, force)."""
    from queues.models import QueueEntry

    return [{"func": "resume", "args": (e.execution_id, e.resume_fence, e.resume_force)}
            for e in QueueEntry.objects.filter(state="pending", resume_fence__isnull=False).order_by("id")]


def run_handed_over_here() -> list[dict]:
    """Run every due queue entry here, as a worker's dispatcher would (queues.run_due): their statuses."""
    from queues import run_due

    return [{"status": status} for status in run_due()]


@flow("leases.sleep_then_fail")
def sleep_then_fail(ctx, value):
    """One step that lasts `seconds` (past the lazy grace: leased), then the flow fails."""
    ctx.step("sleep", lambda: time.sleep(value["seconds"]) or value["seconds"])
    raise RuntimeError("failed on purpose")


@flow("leases.stop_after_each_step")
def stop_after_each_step(ctx, value):
    """`n` steps, each recording its effect and then starting this process's graceful shutdown (what a SIGTERM
    does: leases.keeper.begin_drain), so every run stops at the next step boundary and hands its lease back: each
    takeover continues one step further (tests/leases/test_leases_handback.py)."""
    from leases.keeper import begin_drain

    eid = ctx.execution_id

    def one(i: int) -> int:
        record(eid, f"s{i:03d}")
        begin_drain()
        return i

    for i in range(value["n"]):
        ctx.step(f"s{i:03d}", one, i)
    return value["n"]
