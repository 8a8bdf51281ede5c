"""Flows used by tests/test_leases*.py, importable by child processes (LOOM_FLOW_MODULES)."""

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


@flow("leases.sleep_then_fail")
def sleep_then_fail(ctx, value):
    """One step that lasts `seconds` (past the lazy grace: leased), then the flow fails."""
    ctx.step("sleep", lambda: time.sleep(value["seconds"]) or value["seconds"])
    raise RuntimeError("failed on purpose")
