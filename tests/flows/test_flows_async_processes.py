"""200 `async def` flows that sleep and exchange messages, driven by real `manage.py loom_worker` processes on the
test database (SQLite and PostgreSQL): worker A is SIGKILLed while they are in flight, worker B is stopped with
SIGTERM (a graceful shutdown hands its runs back) after it finished some more, worker C finishes every one;
each effect happens exactly once, each message is consumed once, none is lost. Started here and woken by the
workers' wakers, their journal calls run in the workers' threads and their code on each worker's event loop
(journal/flows/aio.py); the same 200 queued run from the workers' event loops (queues/loop.py: their sleeps slept
there), worker after worker SIGKILLed at random moments, with the same result. And a process that drives async
flows from its loop (astart) is SIGKILLed while 20 of them sleep in-process, holding no thread: a worker recovers
each, and each effect happens once."""

from __future__ import annotations

import collections
import json
import random
import subprocess
import sys
import time

import pytest

from journal.flows import start
from journal.models import Event, Execution, Message
from queues import enqueue
from tests.conftest import ROOT
from tests.fixtures import edge_waits_flows as wf
from tests.flows.test_waits_processes import Worker, all_settled, env, wait_until, workers  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db(transaction=True)

PAIRS = 100


def test_workers_killed_and_stopped_under_200_async_flows_that_sleep_and_message_lose_none_repeat_none(workers):  # noqa: F811
    ids = [f"ak-{i:03d}" for i in range(2 * PAIRS)]
    for i, eid in enumerate(ids):
        out = start("edge.async_pinger", pinger_input(ids, i), execution_id=eid)
        assert out.status == "waiting"  # this process ran its first step and parked it on its sleep
    a = workers("ak-a")
    wait_until(lambda: sum(1 for _, step in wf.effects("ak-") if step.startswith("got:")) >= 10,
               "worker A completes some exchanges", [a], timeout=120)
    a.kill()
    assert not all_settled("ak-"), "nothing was in flight when A died: the kill proved nothing"
    b = workers("ak-b")
    done_by_a = Execution.objects.filter(pk__startswith="ak-", status="completed").count()
    wait_until(lambda: all_settled("ak-") or Execution.objects.filter(pk__startswith="ak-", status="completed")
               .count() >= done_by_a + 20, "worker B completes some more", [b], timeout=120)
    b.stop()  # SIGTERM: a graceful shutdown hands what it runs back (docs/workers.md), with async flows too
    assert b.proc.returncode == 0, b.output()
    c = workers("ak-c")
    wait_until(lambda: all_settled("ak-"), "worker C finishes every async flow", [c], timeout=180)

    assert_each_pair_exchanged_once("ak-", ids)


def pinger_input(ids: list[str], i: int, scale: float = 1.0) -> dict:
    """Pairs (0, 1), (2, 3), ...: each sends to the other and waits for its message, after a sleep of its own
    (0.2 s to 1.1 s, times `scale`)."""
    return {"seconds": (0.2 + (i % 10) * 0.1) * scale, "peer": ids[i ^ 1]}


def assert_each_pair_exchanged_once(prefix: str, ids: list[str]) -> None:
    """Every pinger completed with its peer's id; each effect once, each message consumed once, none lost."""
    statuses = collections.Counter(Execution.objects.filter(pk__startswith=prefix).values_list("status", flat=True))
    assert statuses == {"completed": 2 * PAIRS}
    counts = collections.Counter(wf.effects(prefix))
    for i, eid in enumerate(ids):
        peer = ids[i ^ 1]
        assert counts[(eid, "before")] == 1 and counts[(eid, f"got:{peer}")] == 1, (eid, counts[(eid, "before")])
        assert Execution.objects.get(pk=eid).result == peer
    assert sum(counts.values()) == 4 * PAIRS  # no other effect row: nothing ran twice
    rows = Message.objects.filter(execution_id__startswith=prefix)
    assert rows.count() == 2 * PAIRS and not rows.filter(consumed_at__isnull=True).exists()


KILLS = 4
SEED = 34


def test_workers_sigkilled_at_random_moments_under_200_queued_async_flows_on_their_loops_repeat_no_effect(
        workers, settings):  # noqa: F811
    """The same 200 pingers, queued: each worker runs them on its event loop (queues/loop.py), their sleeps
    in-process there; worker after worker is SIGKILLed at a random moment once it made progress, a last one
    finishes: each effect once, each message consumed once, none lost."""
    settings.LOOM_QUEUES = {"apq": {"concurrency": 1000}}
    loop_env = {"LOOM_WAIT_INLINE_MAX": "15", "LOOM_QUEUE_THREADS": "2", "LOOM_QUEUE_ASYNC_RUNS": "150",
                "LOOM_QUEUE_POLL": "0.05", "LOOM_QUEUES": json.dumps({"apq": {"concurrency": 1000}}),
                # Each kill is a recovery attempt of every run in flight (and a loaded machine's lapsed 1 s leases
                # more): this test is about exactly-once, not about when recovery gives up (stuck).
                "LOOM_RECOVERY_MAX_ATTEMPTS": "100"}
    ids = [f"aq-{i:03d}" for i in range(2 * PAIRS)]
    for i, eid in enumerate(ids):
        # Sleeps of 2 s to 11 s, in-process (under the workers' LOOM_WAIT_INLINE_MAX): on their loops when a kill comes
        enqueue("edge.async_pinger", pinger_input(ids, i, scale=10), queue="apq", execution_id=eid)
    moments = random.Random(SEED)
    for round_ in range(KILLS):
        done = len(wf.effects("aq-"))
        w = workers(f"aq-k{round_}", **loop_env)
        wait_until(lambda: len(wf.effects("aq-")) > done or all_settled("aq-"),  # noqa: B023 (called at once)
                   f"worker {round_} (seed {SEED}) makes progress", [w], timeout=120)
        time.sleep(moments.uniform(0.0, 1.5))  # a random moment with runs in flight (no timing is asserted)
        w.kill()
    assert not all_settled("aq-"), "every pinger finished before the last kill: the kills proved too little"
    last = workers("aq-z", **loop_env)
    wait_until(lambda: all_settled("aq-"), "the last worker finishes every pinger", [last], timeout=240)
    assert_each_pair_exchanged_once("aq-", ids)


SLEEPERS = 20
DRIVER = """
import asyncio, sys, threading
import django
django.setup()
from journal.flows import aio
from tests.flows import async_sleep_flows  # noqa: F401 (registers asleep.edge)

async def main():
    runs = [asyncio.ensure_future(aio.astart("asleep.edge", {"seconds": 20}, f"ask-{i:02d}")) for i in range(%d)]
    while aio.stats()["napping"] < len(runs):
        await asyncio.sleep(0.05)
    held = aio.stats()
    print("ASLEEP", held["napping"], held["pool_busy"], threading.active_count(), flush=True)
    await asyncio.gather(*runs)

asyncio.run(main())
"""


class Driver(Worker):
    """A process that astarts async flows and drives them from its loop (not a worker), in its own group (read and
    killed as a worker is)."""

    def __init__(self, environ: dict, tmp_log):
        self.name, self.log = "astart-driver", tmp_log
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen([sys.executable, "-c", DRIVER % SLEEPERS], env=environ, cwd=ROOT, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)


def test_a_process_killed_while_its_loop_driven_async_flows_sleep_in_process_leaves_them_to_a_worker(
        env, workers, tmp_path):  # noqa: F811
    modules = "tests.fixtures.edge_waits_flows,tests.flows.async_sleep_flows"
    # In the driver the 20 s sleeps are in-process (under its LOOM_WAIT_INLINE_MAX), slept on its loop.
    driver = Driver({**env, "LOOM_FLOW_MODULES": modules, "LOOM_WAIT_INLINE_MAX": "60"}, tmp_path / "driver.log")
    try:
        wait_until(lambda: "ASLEEP" in driver.log.read_text(), "the driver's runs all asleep", [driver], timeout=120)
        driver.kill()
    finally:
        driver.kill()
    napping, busy, threads = map(int, driver.log.read_text().split("ASLEEP", 1)[1].split()[:3])
    assert (napping, busy) == (SLEEPERS, 0)  # every run asleep, no pool thread in a call
    assert threads < SLEEPERS  # the process's every thread: far fewer than one per sleeping run
    assert not all_settled("ask-"), "nothing was in flight when the driver died: the kill proved nothing"
    assert collections.Counter(step for _, step in wf.effects("ask-")) == {"before": SLEEPERS}
    w = workers("ask-w", LOOM_FLOW_MODULES=modules)  # recovers each (its lease lapsed), replays, sleeps the rest
    wait_until(lambda: all_settled("ask-"), "the worker finishes every run the driver left", [w], timeout=180)
    assert collections.Counter(Execution.objects.filter(pk__startswith="ask-").values_list("status", flat=True)) \
        == {"completed": SLEEPERS}
    counts = collections.Counter(wf.effects("ask-"))
    assert counts == {(f"ask-{i:02d}", step): 1 for i in range(SLEEPERS) for step in ("before", "after")}
    for i in range(SLEEPERS):
        assert sum(1 for e in Event.objects.read(f"ask-{i:02d}") if e.type == "WAIT_STARTED") == 1  # one sleep
