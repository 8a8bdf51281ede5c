"""Across retention (journal/retention.py), a paused queue and a drained worker: whatever their age, a queued
start of a paused queue is never removed, neither by the journal's retention nor by the queues' pruning of
finished entries: not one waiting in the queue, not one a worker claimed and then drained away from without
beginning it. Settled executions beside them are removed as usual; resumed, the queue runs the kept ones.
Both backends."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from journal import retention
from journal.flows import ownership as own
from journal.flows import start
from journal.models import Event, Execution
from leases.drain import DrainStore
from leases.models import Worker
from queues import enqueue, pause, run_due
from queues.declarations import declare_queue
from queues.declarations import forget as forget_queue
from queues.models import Queue, QueueEntry
from queues.store import store_for
from tests.fixtures import queue_flows  # noqa: F401  (queues.test.double)

pytestmark = pytest.mark.django_db(transaction=True)

OLD = timedelta(days=400)


def test_queued_starts_of_a_paused_queue_outlive_retention_and_pruning_even_claimed_by_a_drained_worker(settings):
    settings.LOOM_RETENTION_DAYS = 30
    settings.LOOM_QUEUE_RETENTION = 0.0  # the queues' own pruning: every finished entry is due at once
    installed = own.get_ownership()
    own.set_ownership(None)  # no lease keeper in this process: run_due runs in the test's thread
    declare_queue("xr-q", concurrency=4)
    try:
        enqueue("queues.test.double", {"n": 1}, queue="xr-q", execution_id="xr-done")
        assert run_due() == ["completed"]
        start("queues.test.double", {"n": 2}, execution_id="xr-direct")
        enqueue("queues.test.double", {"n": 3}, queue="xr-q", execution_id="xr-claimed")
        (claimed,) = store_for().dequeue("xr-q", "xr-worker", 1, ["queues.test.double"], 3600.0)
        assert claimed.execution_id == "xr-claimed"  # claimed, never begun: the worker drains away
        Worker.objects.create(id="xr-worker", host="h", pid=1, role="main")
        drains = DrainStore("default")
        assert drains.request("xr-worker", "op")
        drains.seen("xr-worker")
        drains.done("xr-worker")
        Worker.objects.filter(pk="xr-worker").update(stopped_at=timezone.now())
        assert pause.pause("xr-q", "op").paused
        enqueue("queues.test.double", {"n": 4}, queue="xr-q", execution_id="xr-waiting")
        enqueue("queues.test.double", {"n": 5}, queue="xr-q", execution_id="xr-later",
                run_after=timezone.now() + timedelta(days=1))
        kept = ["xr-claimed", "xr-waiting", "xr-later"]
        settled = ["xr-done", "xr-direct"]
        long_ago = timezone.now() - OLD
        Execution.objects.filter(pk__in=kept + settled).update(created_at=long_ago, updated_at=long_ago)
        Execution.objects.filter(pk__in=settled).update(finished_at=long_ago)
        QueueEntry.objects.filter(execution_id__in=kept + settled).update(enqueued_at=long_ago)
        QueueEntry.objects.filter(execution_id="xr-claimed").update(started_at=long_ago)
        tips = {eid: Event.objects.tip(eid) for eid in kept}

        removed = retention.run("default", now=timezone.now() + OLD)  # a year on: everything settled is due
        pruned = store_for().prune_entries(0.0)

        assert removed["executions"] == 2 and not Execution.objects.filter(pk__in=settled).exists()
        assert pruned == 0  # xr-done's entry went with its execution; no queued one is "finished"
        assert dict(Execution.objects.filter(pk__in=kept).values_list("id", "status")) == dict.fromkeys(kept, "queued")
        states = dict(QueueEntry.objects.filter(execution_id__in=kept).values_list("execution_id", "state"))
        assert states == {"xr-claimed": "started", "xr-waiting": "pending", "xr-later": "pending"}
        assert {eid: Event.objects.tip(eid) for eid in kept} == tips
        assert Queue.objects.get(pk="xr-q").paused_at is not None
        assert run_due() == []  # still paused

        pause.resume("xr-q")
        QueueEntry.objects.filter(execution_id="xr-later").update(run_after=timezone.now())
        store = store_for()
        assert store.dequeue("xr-q", "xr-next", 0, ["queues.test.double"], 1.0) == []  # re-offers the lost claim
        assert sorted(run_due()) == ["completed"] * 3
        results = dict(Execution.objects.filter(pk__in=kept).values_list("id", "result"))
        assert results == {"xr-claimed": 6, "xr-waiting": 8, "xr-later": 10}
    finally:
        own.set_ownership(installed)
        forget_queue("xr-q")
