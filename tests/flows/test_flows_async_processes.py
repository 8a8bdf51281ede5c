"""200 `async def` flows that sleep and exchange messages, driven by real `manage.py loom_worker` processes on the
test database (SQLite and PostgreSQL): worker A is SIGKILLed while they are in flight, worker B is stopped with
SIGTERM (a graceful shutdown hands its runs back) after it finished some more, worker C finishes every one;
each effect happens exactly once, each message is consumed once, none is lost. The flows' journal calls run in the
workers' threads and their code on each worker's event loop (journal/flows/aio.py)."""

from __future__ import annotations

import collections

import pytest

from journal.flows import start
from journal.models import Execution, Message
from tests.fixtures import edge_waits_flows as wf
from tests.flows.test_waits_processes import all_settled, env, wait_until, workers  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db(transaction=True)

PAIRS = 100


def test_workers_killed_and_stopped_under_200_async_flows_that_sleep_and_message_lose_none_repeat_none(workers):  # noqa: F811
    ids = [f"ak-{i:03d}" for i in range(2 * PAIRS)]
    for i, eid in enumerate(ids):
        peer = ids[i ^ 1]  # pairs (0, 1), (2, 3), ...: each sends to the other and waits for its message
        out = start("edge.async_pinger", {"seconds": 0.2 + (i % 10) * 0.1, "peer": peer}, execution_id=eid)
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

    statuses = collections.Counter(Execution.objects.filter(pk__startswith="ak-").values_list("status", flat=True))
    assert statuses == {"completed": 2 * PAIRS}
    counts = collections.Counter(wf.effects("ak-"))
    for i, eid in enumerate(ids):
        peer = ids[i ^ 1]
        assert counts[(eid, "before")] == 1 and counts[(eid, f"got:{peer}")] == 1, (eid, counts[(eid, "before")])
        assert Execution.objects.get(pk=eid).result == peer
    assert sum(counts.values()) == 4 * PAIRS  # no other effect row: nothing ran twice
    rows = Message.objects.filter(execution_id__startswith="ak-")
    assert rows.count() == 2 * PAIRS and not rows.filter(consumed_at__isnull=True).exists()
