"""A flow, an aggregate and a projection for the shard tests' child processes (LOOM_FLOW_MODULES,
LOOM_PROJECTION_MODULES, LOOM_AGGREGATE_MODULES name this module).

The flow's effects are written to the execution's own shard, inside the atomic step's transaction, so a
step that ran twice would show two rows. The projection feeds ONE read model (on the default database)
from every shard: each shard's drain applies its own events; the read model keys rows by (stream, seq),
so a redelivery is a no-op (docs/scaling.md: a read model fed from several shards)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from django.db import DEFAULT_DB_ALIAS, connections

from journal import shards
from journal.flows import flow
from projections.declarations import projection
from tests import aggregate_fixtures  # noqa: F401  (the TestHotCounter aggregate)

EFFECTS = "test_shard_effects"
SEEN = "test_shard_seen"


def create_tables(alias: str) -> None:
    with connections[alias].cursor() as cursor:
        cursor.execute(f"CREATE TABLE IF NOT EXISTS {EFFECTS} (execution_id varchar(200), step varchar(50), pid int)")
        cursor.execute(f"CREATE TABLE IF NOT EXISTS {SEEN} (stream varchar(200), seq int, type varchar(100),"
                       " PRIMARY KEY (stream, seq))")


@flow("shards.steps")
def steps(ctx, value):
    """`n` atomic steps recording their effect on the execution's shard; each waits for the file `gate`
    (when given) before it completes, so a test can hold runs mid-flight."""
    eid = ctx.execution_id

    def one(i: int) -> int:
        gate = value.get("gate")
        while gate and not Path(gate).exists():
            time.sleep(0.05)
        with connections[shards.home()].cursor() as cursor:
            cursor.execute(f"INSERT INTO {EFFECTS} (execution_id, step, pid) VALUES (%s, %s, %s)",
                           [eid, f"s{i}", os.getpid()])
        return i

    for i in range(value["n"]):
        ctx.step(f"s{i}", one, i, atomic=True)
    return value["n"]


@flow("shards.one")
def one_step(ctx, value):
    return ctx.step("one", lambda: value)


def _seen(event, target) -> None:
    with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
        cursor.execute(f"INSERT INTO {SEEN} (stream, seq, type) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                       [event.stream_id, event.seq, event.type])


seen = projection("shard-seen", on=["Incremented"], handler=_seen)


@flow("shards.recv")
def recv_flow(ctx, value):
    """Parks until a message on "go" (or a wake_now); publishes what it got."""
    got = ctx.recv("go")
    ctx.set_event("got", got)
    return got


@flow("shards.parent")
def parent_flow(ctx, value):
    """A child of the default id (`<parent>.child-0`: the parent's shard) or of the id given (any shard)."""
    handle = ctx.start_child("shards.one", value["n"], execution_id=value.get("child"))
    return {"child": handle.execution_id, "result": handle.result()}


@flow("shards.chain")
def chain_flow(ctx, value):
    n = ctx.step("count", lambda: value["n"] + 1)
    if n < value["until"]:
        ctx.continue_as_new({"n": n, "until": value["until"]})
    return n
