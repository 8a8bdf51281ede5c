"""What the sections of `manage.py bench_waits` share: their flows, the worker they measure, clean-up.

The flows that wait are started in the bench process (`start(..., start_at=...)`: bootstrapped and
parked, no thread) and woken by a real `manage.py loom_worker --no-cluster` child process: its
flow-waker service (LISTEN/NOTIFY on PostgreSQL, a poll as fallback) is what a deployment runs, so
lateness and round trips are the product's, not a test loop's. The child imports this module
(LOOM_FLOW_MODULES) to have the flows.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from django.conf import settings
from django.db import connection

from benchmarks.children import database_url
from journal import conf
from journal.flows import flow, registry
from journal.store import store_for

ROOT = Path(__file__).resolve().parent.parent.parent
MODULE = "benchmarks.sections.waits"


@flow("bench.waits.stamp")
def stamp(ctx, value):
    """The wall-clock time its first step ran: minus the due time, the wake-up's lateness."""
    return ctx.step("t", time.time)


@flow("bench.waits.echo")
def echo(ctx, value):
    """`rounds` round trips: recv "ping" -> set_event("pong-<i>", payload)."""
    for i in range(value["rounds"]):
        got = ctx.recv("ping")
        ctx.set_event(f"pong-{i}", got)
    return value["rounds"]


@flow("bench.waits.nap")
def nap(ctx, value):
    """A step, a durable sleep of `nap` seconds, a step: thousands of these sleep at once in a worker."""
    ctx.step("a", int)
    ctx.sleep(value["nap"])
    return ctx.step("b", int)


class WorkerProcess:
    """A `loom_worker --no-cluster` child (its waker, leases and recovery), output to a file."""

    def __init__(self, name: str, **extra: str):
        env = dict(os.environ)  # the bench's own LOOM_* settings (its environment) apply to the worker too
        env.update({
            "DATABASE_URL": database_url(), "PYTHONPATH": str(ROOT), "LOOM_FLOW_MODULES": MODULE,
            "DJANGO_SETTINGS_MODULE": settings.SETTINGS_MODULE or os.environ.get("DJANGO_SETTINGS_MODULE", ""),
            "SECRET_KEY": settings.SECRET_KEY, "ALLOW_DEV_SECRET_KEY": "true", "LOOM_WAIT_INLINE_MAX": "0",
        })
        env.update(extra)
        self.env = env
        self.log = Path(tempfile.mkstemp(prefix=f"bench-waits-{name}-", suffix=".log")[1])
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen([sys.executable, "manage.py", "loom_worker", "--id", name, "--no-cluster"],
                                         env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def ready(self, timeout: float = 120) -> None:
        """Wait until the worker says it runs (its services are up from then on)."""
        deadline = time.monotonic() + timeout
        while " running " not in self.log.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"loom_worker did not start ({self.proc.poll()}):\n{self.tail()}")
            time.sleep(0.05)

    def alive(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"loom_worker exited ({self.proc.returncode}):\n{self.tail()}")

    def tail(self) -> str:
        return self.log.read_text()[-3000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.unlink(missing_ok=True)


@contextlib.contextmanager
def worker(name: str, **extra: str) -> Iterator[WorkerProcess]:
    process = WorkerProcess(name, **extra)
    try:
        process.ready()
        yield process
    finally:
        process.stop()


def threads_of(pid: int) -> int:
    """Threads of a process (Linux: /proc/<pid>/task)."""
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return 0


def connections_of(pid: int) -> int:
    """Database connections a process holds: established TCP sockets to the server's port (PostgreSQL),
    or open descriptors of the database file (SQLite)."""
    s = connection.settings_dict
    fds = Path(f"/proc/{pid}/fd")
    targets = []
    for fd in fds.iterdir() if fds.exists() else ():
        with contextlib.suppress(OSError):
            targets.append(os.readlink(fd))
    if connection.vendor == "sqlite":
        name = str(Path(s["NAME"]).resolve())
        return sum(1 for t in targets if t == name)
    inodes = {t[len("socket:["):-1] for t in targets if t.startswith("socket:[")}
    port = f"{int(s.get('PORT') or 5432):04X}"
    count = 0
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                parts = line.split()
                if parts[2].rsplit(":", 1)[1] == port and parts[3] == "01" and parts[9] in inodes:
                    count += 1
    return count


def worker_settings() -> dict:
    """The waker's settings as the worker reads them (the same environment), recorded with each cell."""

    names = ("LOOM_WAIT_POLL", "LOOM_WAIT_BATCH", "LOOM_NOTIFY")  # (LOOM_WAIT_INLINE_MAX: 0 in the worker)
    return {name.lower(): conf.get_safe(name, None) for name in names}


def remove(prefix: str) -> None:
    """Delete the bench's executions: events, fences, snapshots, headers (and, with the engine's
    delete_executions, their waits, messages and published events)."""

    store = store_for()
    store.delete_streams(prefix)
    store.delete_executions(prefix)


def due_plan() -> dict:
    """The plan and cost of the waker's due-timer statements at the current number of pending timers
    (their growth with that number is the point): the journal store's `explain_due_waits()` if it has
    one, else its own statement texts (journal/store/<backend>.py CLAIM_DUE, NEXT_DUE) explained, never
    run: PostgreSQL `EXPLAIN (FORMAT JSON)` (cost: the top node's total cost), SQLite `EXPLAIN QUERY PLAN`."""
    import importlib
    import json

    from django.utils import timezone

    store = store_for()
    explain = getattr(store, "explain_due_waits", None)
    if explain is not None:
        return explain()
    sql = importlib.import_module(f"journal.store.{'postgres' if connection.vendor == 'postgresql' else 'sqlite'}")
    flows = sorted(registry.registered())
    now = timezone.now()
    if connection.vendor == "postgresql":
        params = {"now": now, "limit": 16, "any_flow": False, "flows": flows}
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN (FORMAT JSON) " + sql.CLAIM_DUE, params)
            claim = _plan_json(cursor.fetchone()[0])
            cursor.execute("EXPLAIN (FORMAT JSON) " + sql.NEXT_DUE)
            probe = _plan_json(cursor.fetchone()[0])
        return {"plan": claim["text"], "cost": claim["cost"], "next_due_plan": probe["text"],
                "next_due_cost": probe["cost"]}
    params = {"now": store._time(now), "limit": 16, "any_flow": False, "flows": json.dumps(flows)}
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN QUERY PLAN " + sql.CLAIM_DUE, params)
        claim = "; ".join(str(row[-1]) for row in cursor.fetchall())
        cursor.execute("EXPLAIN QUERY PLAN " + sql.NEXT_DUE)
        probe = "; ".join(str(row[-1]) for row in cursor.fetchall())
    return {"plan": claim, "cost": None, "next_due_plan": probe, "next_due_cost": None}


def _plan_json(value) -> dict:
    """A PostgreSQL JSON plan as one line (node types, the indexes they use) and its total cost."""
    import json

    plan = (json.loads(value) if isinstance(value, str) else value)[0]["Plan"]

    def line(node: dict) -> str:
        text = node["Node Type"] + (f" using {node['Index Name']}" if node.get("Index Name") else "")
        children = node.get("Plans") or []
        return text + (f" [{', '.join(line(child) for child in children)}]" if children else "")

    return {"text": line(plan), "cost": plan.get("Total Cost")}
