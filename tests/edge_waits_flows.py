"""Flows that wait (issue 17), importable by worker processes (LOOM_FLOW_MODULES=tests.edge_waits_flows).

Every effect is an atomic step that inserts one row into EFFECTS (the row commits with the step's
record), so a count of rows per (execution, step) says how often each step's effect happened:
exactly once, whatever crashed in between.
"""

from __future__ import annotations

import os
import time

from django.db import connection

from journal.flows import flow

EFFECTS = "test_edge_waits_effects"


def create_effects_table() -> None:
    key = "id INTEGER PRIMARY KEY AUTOINCREMENT" if connection.vendor == "sqlite" else "id serial PRIMARY KEY"
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE IF NOT EXISTS {EFFECTS} ({key}, execution_id varchar(200), step varchar(200),"
                       " pid integer)")
        cursor.execute(f"DELETE FROM {EFFECTS}")


def effects(prefix: str = "") -> list[tuple[str, str]]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT execution_id, step FROM {EFFECTS} WHERE execution_id LIKE %s ORDER BY id",
                       [prefix + "%"])
        return [tuple(r) for r in cursor.fetchall()]


def record(execution_id: str, step: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {EFFECTS} (execution_id, step, pid) VALUES (%s, %s, %s)",
                       [execution_id, step, os.getpid()])
    return step


def effect(ctx, name: str) -> str:
    """One atomic step whose effect is one row: exactly once per execution and name."""
    return ctx.step(name, record, ctx.execution_id, name, atomic=True)


@flow("edge.sleeper")
def sleeper(ctx, value):
    """before -> a durable sleep of value["seconds"] -> after."""
    effect(ctx, "before")
    ctx.sleep(value["seconds"])
    effect(ctx, "after")
    return value["seconds"]


@flow("edge.receiver")
def receiver(ctx, value):
    """Waits for one message on value["topic"] (value.get("timeout")), records it, publishes it as
    the event "got" and returns it."""
    effect(ctx, "before")
    got = ctx.recv(value["topic"], timeout=value.get("timeout"))
    effect(ctx, f"got:{got!r}"[:150])
    ctx.set_event("got", got)
    return got


@flow("edge.counter")
def counter(ctx, value):
    """Receives value["n"] messages on "add" and returns their sum: each must be consumed once."""
    total = 0
    for i in range(value["n"]):
        total += ctx.recv("add")
        effect(ctx, f"add-{i}")
        ctx.set_event("total", total)
    return total


@flow("edge.echo")
def echo(ctx, value):
    """The round trip of the benchmark and the API: recv "ping" -> set_event "pong" (the payload)."""
    got = ctx.recv("ping")
    ctx.set_event("pong", got)
    return got


@flow("edge.child")
def child(ctx, value):
    effect(ctx, "child-run")
    if value.get("seconds"):
        ctx.sleep(value["seconds"])
    return value["n"] * 2


@flow("edge.parent")
def parent(ctx, value):
    """Starts one child per n in value["ns"], waits for each result, records the sum."""
    handles = [ctx.start_child("edge.child", {"n": n, "seconds": value.get("seconds", 0)}) for n in value["ns"]]
    total = sum(handle.result() for handle in handles)
    effect(ctx, f"sum:{total}")
    return total


@flow("edge.steps")
def steps(ctx, value):
    """value["n"] plain steps (fork replays those before its step and runs the rest again)."""
    return [effect(ctx, f"s{i}") for i in range(value["n"])]


@flow("edge.gated_after_sleep")
def gated_after_sleep(ctx, value):
    """before -> sleep -> a step that waits for the file value["gate"] (so a worker can be killed in it)
    -> after. A replay after the kill must not sleep again: the sleep's completion is in the log."""
    effect(ctx, "before")
    ctx.sleep(value["seconds"])

    def gate() -> int:
        with open(value["marker"], "a") as fh:
            fh.write(f"{os.getpid()}\n")
        deadline = time.monotonic() + 120
        while not os.path.exists(value["gate"]) and time.monotonic() < deadline:
            time.sleep(0.02)
        return os.getpid()

    ctx.step("gate", gate)
    effect(ctx, "after")
    return value["seconds"]


# -- async flows (journal/flows/aio.py): the same journal, driven by the same workers --------------------------
def _send_to(peer: str, sender: str) -> str:
    """A send inside a step: re-run after a crash, it sends the same message id again (the same send)."""
    from journal.flows import send

    return send(peer, "ping", sender, message_id=f"{sender}->{peer}")


@flow("edge.async_pinger")
async def async_pinger(ctx, value):
    """An `async def` flow: an effect, a durable sleep, a message to its peer, the peer's message, an effect."""
    await ctx.step("before", record, ctx.execution_id, "before", atomic=True)
    await ctx.sleep(value["seconds"])
    await ctx.step("send", _send_to, value["peer"], ctx.execution_id)
    got = await ctx.recv("ping")
    await ctx.step("got", record, ctx.execution_id, f"got:{got}", atomic=True)
    return got
