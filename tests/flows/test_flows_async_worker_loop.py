"""A real `manage.py loom_worker` runs the queued entries of `async def` flows on its event loop (queues/loop.py), on
the test database (SQLite and PostgreSQL): with LOOM_QUEUE_THREADS=2 it has 120 of them asleep in-process at once,
holding no thread and no session each (counted in /proc/<pid>/task and pg_stat_activity); sync and async flows mix
in one worker; a SIGTERM while async runs sleep hands them back at their next step boundary, none repeats a step,
and a restarted worker finishes every one."""

from __future__ import annotations

import collections
import json
import os
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from journal.flows.aio import pool_size
from journal.models import Event, Execution
from leases.budget import WORKER_SERVICES
from queues import enqueue
from tests.fixtures import edge_waits_flows as wf
from tests.flows import async_sleep_flows  # noqa: F401 (registers asleep.edge, asleep.until here)
from tests.flows.test_waits_processes import all_settled, env, wait_until, workers  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = "aloop"
LOOP_ENV = {  # what every worker here runs with: its short sleeps in-process (slept on its loop), two threads
    "LOOM_FLOW_MODULES": "tests.fixtures.edge_waits_flows,tests.flows.async_sleep_flows",
    "LOOM_WAIT_INLINE_MAX": "120", "LOOM_QUEUE_THREADS": "2", "LOOM_QUEUE_ASYNC_RUNS": "150", "LOOM_QUEUE_POLL": "0.05",
    "LOOM_QUEUES": json.dumps({QUEUE: {"concurrency": 1000}}),
}
N = 120


def effects_by_step(prefix: str) -> collections.Counter:
    return collections.Counter(step for _, step in wf.effects(prefix))


def asleep(prefix: str, n: int) -> bool:
    """Every run of the batch recorded its first effect and none its second: all of them are in their sleep."""
    counts = effects_by_step(prefix)
    return counts["before"] == n and counts["after"] == 0


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def sessions_of(app: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [app])
        return cursor.fetchone()[0]


def test_a_worker_with_two_threads_has_120_async_flows_asleep_at_once_holding_no_thread_or_session_each(
        workers, settings):  # noqa: F811
    settings.LOOM_QUEUES = {QUEUE: {"concurrency": 1000}}
    app = "loom-aworker-asleep"
    postgres = connection.vendor == "postgresql"
    # One wake-up time for the whole batch, far enough ahead for every run to be dispatched and asleep before it.
    until = (datetime.now(UTC) + timedelta(seconds=60)).isoformat()
    ids = [enqueue("asleep.until", {"until": until}, queue=QUEUE, execution_id=f"alw-{i:03d}").execution_id
           for i in range(N)]
    w = workers("alw-w", **LOOP_ENV, PGAPPNAME=app)
    wait_until(lambda: asleep("alw-", N), f"all {N} runs asleep on the worker's loop", [w], timeout=55)
    threads = threads_of(w.proc.pid)
    sessions = sessions_of(app) if postgres else None
    assert asleep("alw-", N), "a run woke before the counts were taken: they prove nothing"
    # Every thread of the process (its services, its two runner threads, the loop, the async pool; 20 when this
    # was written): far fewer than one per sleeping run; and its sessions on PostgreSQL at most its services',
    # its runner threads' and the async pool's (leases/budget.py), none per run (10 when this was written).
    assert threads < 30, threads
    if postgres:
        assert sessions <= WORKER_SERVICES + 2 + pool_size(), sessions
    assert Execution.objects.filter(pk__in=ids, status="running").count() == N
    wait_until(lambda: all_settled("alw-"), "every run wakes and completes", [w], timeout=120)
    assert collections.Counter(Execution.objects.filter(pk__in=ids).values_list("status", flat=True)) \
        == {"completed": N}
    assert collections.Counter(wf.effects("alw-")) == {(eid, step): 1 for eid in ids for step in ("before", "after")}
    for eid in ids:
        assert len(Event.objects.read(eid)) == 2 * 3 + 2  # two steps and the sleep: 2n + 2
    assert "completed execution=alw-000 flow=asleep.until" in w.log.read_text()  # run_claimed's own end line


def test_sync_and_async_flows_mix_in_one_worker_and_a_sigterm_during_async_sleeps_repeats_no_step(
        workers, settings):  # noqa: F811
    settings.LOOM_QUEUES = {QUEUE: {"concurrency": 1000}}
    n_async, n_sync = 40, 6
    until = (datetime.now(UTC) + timedelta(seconds=8)).isoformat()
    async_ids = [enqueue("asleep.until", {"until": until}, queue=QUEUE, execution_id=f"alt-a{i:02d}").execution_id
                 for i in range(n_async)]
    sync_ids = [enqueue("edge.sleeper", {"seconds": 0.2}, queue=QUEUE, execution_id=f"alt-s{i:02d}").execution_id
                for i in range(n_sync)]
    # A's grace outlasts the sleeps: each async run wakes, then stops at its next step boundary (the step it
    # would begin is not begun), its sleep recorded as over and its lease handed back.
    a = workers("alt-a", **LOOP_ENV, LOOM_SHUTDOWN_GRACE="30")
    wait_until(lambda: asleep("alt-a", n_async) and all_settled("alt-s"),
               "the async runs asleep on A's loop, the sync ones finished on its threads", [a], timeout=60)
    assert effects_by_step("alt-s") == {"before": n_sync, "after": n_sync}  # sync flows ran on the threads meanwhile
    a.stop()  # SIGTERM during the async sleeps
    assert a.proc.returncode == 0, a.output()
    log = a.log.read_text()
    assert not all_settled("alt-a"), "every async run finished on A: the SIGTERM proved nothing"
    assert "halted execution=alt-a" in log  # run_claimed's status for a run that stopped for the shutdown
    assert effects_by_step("alt-a")["after"] < n_async
    b = workers("alt-b", **LOOP_ENV)  # takes the handed-back runs over at once and finishes each
    wait_until(lambda: all_settled("alt-"), "worker B finishes every run A handed back", [b], timeout=120)
    statuses = collections.Counter(Execution.objects.filter(pk__startswith="alt-").values_list("status", flat=True))
    assert statuses == {"completed": n_async + n_sync}
    counts = collections.Counter(wf.effects("alt-"))
    assert counts == {(eid, step): 1 for eid in async_ids + sync_ids for step in ("before", "after")}
    for eid in async_ids:  # the sleep slept once: one wait begun and one ended, never again after the takeover
        events = Event.objects.read(eid)
        assert sum(1 for e in events if e.type == "WAIT_STARTED") == 1, eid
        assert sum(1 for e in events if e.type == "STEP_COMPLETED" and e.payload.get("step") == "$sleep") == 1, eid
