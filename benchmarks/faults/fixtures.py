"""What the fault scenarios run in their child processes: flows with effects, kill points, tables.

Children list this module in LOOM_FLOW_MODULES. Effects go to `loom_faults_effect`, read models to
`loom_faults_applied`: plain tables made with raw SQL (no migration: they belong to the fault suite,
not to the apps), one row per application, so "exactly once" is a count.

Kill points: a child told `FAULTS_KILL_POINT=<point>` and `FAULTS_KILL_AFTER=<n>` SIGKILLs itself
the n-th time it passes that point: inside a step after its effect was written (`step`), inside a
projection's batch after some of its events were applied (`batch`), after a whole batch was applied
but before its ack committed (`ack`), after a non-atomic reaction's effect but before its ack
(`loose`). Nothing after the kill point runs: the process dies as it would under `kill -9`.
"""

from __future__ import annotations

import os
import signal
import threading
import time

from django.db import connection
from pydantic import BaseModel, Field

from journal.aggregates import State
from journal.flows import flow

EFFECTS = "loom_faults_effect"
APPLIED = "loom_faults_applied"
TYPE = "FaultTick"

_kill = {"point": os.environ.get("FAULTS_KILL_POINT", ""), "after": int(os.environ.get("FAULTS_KILL_AFTER") or 0)}
_passes: dict[str, int] = {}
_lock = threading.Lock()


def kill_point(point: str) -> None:
    """SIGKILL this process the FAULTS_KILL_AFTER-th time it reaches `point` (if that is its kill point)."""
    if _kill["point"] != point:
        return
    with _lock:
        _passes[point] = _passes.get(point, 0) + 1
        if _passes[point] >= _kill["after"]:
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(10)  # not reached: SIGKILL cannot be caught


def create_tables() -> None:
    """The effect and read-model tables (idempotent)."""
    key = "id INTEGER PRIMARY KEY AUTOINCREMENT" if connection.vendor == "sqlite" else "id bigserial PRIMARY KEY"
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE IF NOT EXISTS {EFFECTS} ({key}, execution_id varchar(200), step varchar(50),"
                       " pid integer)")
        cursor.execute(f"CREATE TABLE IF NOT EXISTS {APPLIED} ({key}, consumer varchar(200), stream varchar(200),"
                       " seq bigint, pid integer)")


def record_effect(execution_id: str, step: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {EFFECTS} (execution_id, step, pid) VALUES (%s, %s, %s)",
                       [execution_id, step, os.getpid()])


def record_applied(consumer: str, stream: str, seq: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {APPLIED} (consumer, stream, seq, pid) VALUES (%s, %s, %s, %s)",
                       [consumer, stream, seq, os.getpid()])


@flow("faults.steps")
def steps(ctx, value):
    """`n` atomic steps, each writing its effect and lasting `pause` s: a kill mid-step rolls the
    effect back with the step, so every completed step's effect exists exactly once."""
    eid = ctx.execution_id

    def one(i: int) -> int:
        record_effect(eid, f"s{i:03d}")
        kill_point("step")
        time.sleep(value["pause"])
        return i

    for i in range(value["n"]):
        ctx.step(f"s{i:03d}", one, i, atomic=True)
    return value["n"]


@flow("faults.paused")
def paused(ctx, value):
    """`n` atomic steps; step `at` signals that it runs (a marker file per process) and waits for the
    `release` file: the zombie scenario stops its owner there, past the lease TTL."""
    eid = ctx.execution_id

    def one(i: int) -> int:
        record_effect(eid, f"s{i:03d}")
        if i == value["at"]:
            with open(f"{value['marker']}.{os.getpid()}", "w") as fh:
                fh.write("running")
            deadline = time.monotonic() + 120
            while not os.path.exists(value["release"]) and time.monotonic() < deadline:
                time.sleep(0.02)
        return os.getpid()

    return [ctx.step(f"s{i:03d}", one, i, atomic=True) for i in range(value["n"])]


# -- the aggregate of commit-storm and same-stream ----------------------------------------------------
class Tally(BaseModel):
    count: int = 0


class Counted(BaseModel):
    by: int
    who: str


class Count(BaseModel):
    by: int = Field(default=1, gt=0)
    who: str


tally = State("FaultTally", Tally, prefix="faults:")


@tally.on(Counted)
def _counted(state: Tally, e: Counted) -> dict:
    return {"count": state.count + e.by}


@tally.action(Count)
def count(state: Tally, cmd: Count) -> Counted:
    return Counted(by=cmd.by, who=cmd.who)


# -- kill-after-send: a plain send step whose process dies between the send's commit and the step's record ----
@flow("faults.receiver")
def receiver(ctx, value):
    """Waits for one message on `go` (woken by the send; a worker's waker runs the rest)."""
    return ctx.recv("go")


@flow("faults.sender")
def sender(ctx, value):
    """One plain (not atomic) step: send to its receiver (`<prefix>recv-<n>` for `<prefix>send-<n>`) with a
    fixed message id, then the kill point `sent`: the send committed, the step is not recorded. Its recovery
    runs the step again; by then the receiver may have completed: the send must be the same send (#35)."""
    from journal.flows import send

    eid = ctx.execution_id
    head, _, n = eid.rpartition("send-")

    def deliver() -> str:
        message_id = send(f"{head}recv-{n}", "go", {"from": eid}, message_id=f"{eid}:go")
        kill_point("sent")
        return message_id

    return ctx.step("send", deliver)


# -- exit-on-cap-one: a queued flow that calls sys.exit() on a queue of concurrency 1 ----------------------
@flow("faults.exits")
def exits(ctx, value):
    """A step calls sys.exit(3): a failure of the execution (#35), not a stuck one holding the queue's slot."""
    import sys

    return ctx.step("exit", sys.exit, 3)


# -- connection-spike: parked flows that fall due while the server has no connection to give ---------------
@flow("faults.napper")
def napper(ctx, value):
    """Parks on a sleep of `seconds`, then one atomic step with its effect (exactly once)."""
    eid = ctx.execution_id
    ctx.sleep(value["seconds"])

    def after() -> str:
        record_effect(eid, "after")
        return "after"

    return ctx.step("after", after, atomic=True)
