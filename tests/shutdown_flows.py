"""Flows and a Django task of the graceful-shutdown and interruptible-step tests, importable by worker
processes (LOOM_FLOW_MODULES=tests.shutdown_flows)."""

from __future__ import annotations

import os
import socket
import time

from django.db import connection

from journal.flows import flow

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task

EFFECTS = "test_shutdown_effects"


def create_effects_table() -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE IF NOT EXISTS {EFFECTS} (execution_id varchar(200), step varchar(50),"
                       " pid integer)")


def effect_counts(prefix: str) -> dict[tuple[str, str], int]:
    """How many times each (execution, step) recorded its effect."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT execution_id, step, COUNT(*) FROM {EFFECTS} WHERE execution_id LIKE %s "
                       "GROUP BY execution_id, step", [prefix + "%"])
        return {(eid, step): n for eid, step, n in cursor.fetchall()}


def record(execution_id: str, step: str) -> None:
    """The step's effect, committed at once (not with the step's record): a step that runs twice shows twice."""
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {EFFECTS} (execution_id, step, pid) VALUES (%s, %s, %s)",
                       [execution_id, step, os.getpid()])


@flow("shutdown.steps")
def steps(ctx, value):
    """`n` steps; each records its effect first, then works `pause` seconds: an interrupted step shows its
    effect twice once it runs again."""
    eid = ctx.execution_id

    def one(i: int) -> int:
        record(eid, f"s{i}")
        time.sleep(value["pause"])
        return i

    for i in range(value["n"]):
        ctx.step(f"s{i}", one, i)
    return value["n"]


@task
def slow_effect(key: str, seconds: float) -> str:
    """A one-step Django task: its effect, then `seconds` of work."""
    record(key, "task")
    time.sleep(seconds)
    return key


def read_dead_socket(port: int) -> bytes:
    """Connect to a listening socket that never accepts nor answers, and wait for its answer: hangs."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        return sock.recv(1)


@flow("shutdown.hang")
def hang(ctx, value):
    """One step blocked on a socket that never answers: it ignores every heartbeat and cancel."""
    return ctx.step("read", read_dead_socket, value["port"], timeout=value.get("timeout"))


@flow("shutdown.patient")
def patient(ctx, value):
    """One step that heartbeats while it works for up to a minute: told of its timeout, it stops."""

    def work() -> str:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ctx.heartbeat({"at": time.monotonic()})
            time.sleep(0.05)
        return "worked a minute"

    return ctx.step("work", work, timeout=value["timeout"])


@flow("shutdown.silent")
def silent(ctx, value):
    """Its first attempt anywhere hangs without a heartbeat (the marker file says it ran); a later one returns."""

    def once() -> int:
        if not os.path.exists(value["marker"]):
            with open(value["marker"], "w") as fh:
                fh.write(str(os.getpid()))
            while True:
                time.sleep(1)
        return os.getpid()

    return ctx.step("once", once, heartbeat_timeout=value["heartbeat_timeout"])
