"""Flows that wait, driven by real `manage.py loom_worker` processes on the test database (SQLite and
PostgreSQL): a worker SIGKILLed while flows sleep, wait for messages and wait for children leaves them
to another worker, which finishes every one; each step's effect happens once, each message is consumed
once, no timer fires twice, two workers racing for the same due timers wake each once, and a replay
after a crash never sleeps again.

The flows (tests/fixtures/edge_waits_flows.py) record every effect in an atomic step (one row per effect), so the
rows count how often each effect happened. Executions are started in this process with
LOOM_WAIT_INLINE_MAX=0: every wait parks (status waiting) and only a worker's waker resumes it.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from journal.flows import ownership, send, start
from journal.models import Event, Execution, Fence
from tests.conftest import ROOT
from tests.fixtures import edge_waits_flows as wf

pytestmark = pytest.mark.django_db(transaction=True)

SETTLED = ("completed", "failed", "cancelled", "stuck")


@pytest.fixture
def env(child_env, settings, tmp_path):
    settings.LOOM_WAIT_INLINE_MAX = 0.0
    settings.LOOM_FLOW_MODULES = ["tests.fixtures.edge_waits_flows"]
    child_env.update({
        "LOOM_LEASE_TTL": "1.0", "LOOM_LEASE_RENEW_EVERY": "0.2", "LOOM_LEASE_LAZY_GRACE": "0.2",
        "LOOM_RECOVERY_EVERY": "0.2", "LOOM_LEASE_MODE": "lazy", "LOOM_FLOW_MODULES": "tests.fixtures.edge_waits_flows",
        "LOOM_WAIT_INLINE_MAX": "0", "LOOM_WAIT_POLL": "0.2", "LOOM_WAIT_RECHECK": "1.0",
        "PYTHONFAULTHANDLER": "1", "LOOM_TEST_LOGS": str(tmp_path),
    })
    wf.create_effects_table()
    installed = ownership.get_ownership()
    ownership.set_ownership(None)  # this process only starts executions: no lease keeper thread in it
    yield child_env
    ownership.set_ownership(installed)


class Worker:
    """One `loom_worker --no-cluster` (its waker, leases and recovery sweep) in its own process group."""

    def __init__(self, env: dict, name: str):
        self.name = name
        self.log = Path(env["LOOM_TEST_LOGS"]) / f"{name}.log"
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen([sys.executable, "manage.py", "loom_worker", "--id", name, "--no-cluster"],
                                         env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def output(self) -> str:
        return self.log.read_text()[-4000:]

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def workers(env):
    started: list[Worker] = []

    def spawn(name: str, **extra: str) -> Worker:
        worker = Worker({**env, **extra}, name)
        started.append(worker)
        return worker

    yield spawn
    for worker in started:
        worker.stop()


def wait_until(predicate, what: str, alive: list[Worker], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        for worker in alive:
            if worker.proc.poll() is not None:
                raise AssertionError(f"{what}: {worker.name} exited ({worker.proc.returncode}):\n{worker.output()}")
        if time.monotonic() > deadline:
            states = collections.Counter(Execution.objects.values_list("status", flat=True))
            raise AssertionError(f"timed out waiting for: {what} (statuses {dict(states)})\n"
                                 + "\n".join(w.output() for w in alive))
        time.sleep(0.05)


def all_settled(prefix: str) -> bool:
    return not Execution.objects.filter(pk__startswith=prefix).exclude(status__in=SETTLED).exists()


def events_of(execution_id: str) -> list:
    return list(Event.objects.read(execution_id))


def sleeps_completed(execution_id: str) -> int:
    return sum(1 for e in events_of(execution_id)
               if e.type == "STEP_COMPLETED" and str(e.payload.get("step", "")).startswith("$sleep"))


def waits_started(execution_id: str) -> int:
    return sum(1 for e in events_of(execution_id) if e.type == "WAIT_STARTED")


def assert_once(prefix: str) -> collections.Counter:
    """Every (execution, effect) row at most once; returns the counts."""
    counts = collections.Counter(wf.effects(prefix))
    twice = {key: n for key, n in counts.items() if n > 1}
    assert not twice, f"effects that happened more than once: {twice}"
    return counts


def test_a_worker_killed_while_flows_wait_leaves_them_to_another_that_finishes_each_once(workers):
    """Sleeps, message waits and child waits; worker A is SIGKILLed once some timers fired; worker B
    finishes everything: each effect once, each message consumed once, each timer fired once."""
    from journal.models import Message

    sleepers = [f"kw-s{i}" for i in range(6)]
    for i, eid in enumerate(sleepers):
        assert start("edge.sleeper", {"seconds": 0.5 + 0.4 * i}, execution_id=eid).status == "waiting"
    receivers = [f"kw-r{i}" for i in range(4)]
    for eid in receivers:
        assert start("edge.receiver", {"topic": "go"}, execution_id=eid).status == "waiting"
    send("kw-r0", "go", {"early": 0}, message_id="early-0")  # sent before anyone runs: kept
    assert start("edge.counter", {"n": 3}, execution_id="kw-c").status == "waiting"
    assert start("edge.parent", {"ns": [1, 2], "seconds": 1.0}, execution_id="kw-p").status == "waiting"

    a = workers("kw-a")
    wait_until(lambda: ("kw-s0", "after") in wf.effects("kw-s0"), "worker A fires the first timer", [a])
    send("kw-r1", "go", {"during": 1}, message_id="during-1")
    send("kw-c", "add", 1, message_id="c-1")
    a.kill()
    assert not all_settled("kw-"), "nothing was left waiting when A died: the kill proved nothing"
    # After the kill: more messages (and one sent twice: consumed once), then a fresh worker.
    for i, eid in enumerate(receivers[2:], start=2):
        for _ in range(2):
            send(eid, "go", {"after": i}, message_id=f"after-{i}")
    send("kw-r1", "go", {"during": 1}, message_id="during-1")  # a repeat of an id: nothing new
    send("kw-c", "add", 10, message_id="c-2")
    send("kw-c", "add", 100, message_id="c-3")
    b = workers("kw-b")
    wait_until(lambda: all_settled("kw-") and Execution.objects.filter(flow="edge.child", status="completed")
               .count() == 2, "worker B finishes everything", [b], timeout=90)

    statuses = dict(Execution.objects.filter(pk__startswith="kw-").values_list("pk", "status"))
    assert set(statuses.values()) == {"completed"}, statuses
    counts = assert_once("kw-")
    for eid in sleepers:  # each timer fired once, and a replay never parked again on it
        assert counts[(eid, "before")] == counts[(eid, "after")] == 1
        assert sleeps_completed(eid) == 1 and waits_started(eid) == 1, eid
    results = {eid: Execution.objects.get(pk=eid).result for eid in receivers}
    assert results == {"kw-r0": {"early": 0}, "kw-r1": {"during": 1}, "kw-r2": {"after": 2}, "kw-r3": {"after": 3}}
    assert Execution.objects.get(pk="kw-c").result == 111  # 3 messages, each added once
    assert counts[("kw-p", "sum:6")] == 1
    children = Execution.objects.filter(flow="edge.child").values_list("pk", flat=True)
    assert sorted(counts[(c, "child-run")] for c in children) == [1, 1]
    # each message row consumed exactly once (a repeated message_id was never stored twice)
    rows = Message.objects.filter(execution_id__startswith="kw-")
    assert rows.count() == 7 and not rows.filter(consumed_at__isnull=True).exists()


def test_two_workers_racing_for_the_same_due_timers_wake_each_once(workers):
    """Timers all due at the same instant, two workers' wakers claiming at once: every execution is
    woken by exactly one claim (its fence advanced once from where it parked), its effect once."""
    from datetime import timedelta

    from django.utils import timezone

    from journal.flows import wake_due

    # The fence of an execution whose timers each fired once: a reference run of the same shape (a
    # scheduled start, then a sleep), woken in this process alone.
    start("edge.sleeper", {"seconds": 0}, execution_id="ref-once", start_at=timezone.now())
    deadline = time.monotonic() + 10
    while Execution.objects.get(pk="ref-once").status != "completed" and time.monotonic() < deadline:
        wake_due()
        time.sleep(0.02)
    once = Fence.objects.current("ref-once")

    n = 40
    ids = [f"race-{i}" for i in range(n)]
    when = timezone.now() + timedelta(seconds=6)  # both workers are up by then (their start-up is slower)
    for eid in ids:
        assert start("edge.sleeper", {"seconds": 0}, execution_id=eid, start_at=when).status == "waiting"
    # No leases, so no recovery sweep: only a waker's claim advances a fence (a sweep's takeover of a
    # slow woken run, legitimate under load, would advance it too and prove nothing about wake-ups).
    a, b = workers("race-a", LOOM_LEASE_MODE="off"), workers("race-b", LOOM_LEASE_MODE="off")
    wait_until(lambda: all_settled("race-"), "both workers finish the race", [a, b], timeout=90)
    counts = assert_once("race-")
    assert all(counts[(eid, "after")] == 1 for eid in ids)
    fences = {eid: Fence.objects.current(eid) for eid in ids}
    assert set(fences.values()) == {once}, f"executions woken more than once: {fences} (once = {once})"


def test_a_replay_after_a_crash_never_sleeps_again(workers, tmp_path):
    """Worker A wakes the sleep and is SIGKILLed in the step after it; worker B's recovery replays the
    flow: the recorded sleep returns from the log (no second WAIT_STARTED), the step runs again."""
    gate, marker = tmp_path / "gate", tmp_path / "marker"
    value = {"seconds": 0.5, "gate": str(gate), "marker": str(marker)}
    assert start("edge.gated_after_sleep", value, execution_id="replay-1").status == "waiting"
    a = workers("replay-a")
    wait_until(lambda: marker.exists(), "worker A runs the step after the sleep", [a])
    a.kill()
    gate.write_text("open")
    b = workers("replay-b")
    wait_until(lambda: all_settled("replay-"), "worker B recovers the run", [b], timeout=90)
    assert Execution.objects.get(pk="replay-1").status == "completed"
    assert waits_started("replay-1") == 1 and sleeps_completed("replay-1") == 1
    assert len(marker.read_text().split()) == 2  # the gate step ran in A (killed) and again in B
    assert assert_once("replay-")[("replay-1", "after")] == 1
