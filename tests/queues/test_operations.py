"""The operator's actions in-process, on both databases (queues/pause.py, leases/drain.py, leases/schedule_ops.py,
the `loom` verbs): pause x flow versions, pause x cancel, run-now x a paused queue, backfill x queue caps and
dedup, a paused schedule's tick, the operations page's figures, and bad input refused with nothing written."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command
from django.test import Client
from hypothesis import HealthCheck, example, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from journal import retention
from journal.flows import cancel, registry
from journal.flows.ownership import get_ownership, set_ownership
from journal.models import Execution
from leases import drain, schedule_ops
from leases import schedules as sc
from leases.models import DrainRequest, Schedule, Worker
from leases.schedules import InvalidSchedule
from queues import declare_queue, enqueue, operations, pause, run_due
from queues.declarations import forget
from queues.exceptions import UnknownQueue
from queues.models import Queue, QueueEntry
from queues.store import store_for
from tests.fixtures import schedule_flows, version_queued_v1, version_queued_v2  # noqa: F401  (the flows)
from tests.fixtures.version_common import create_effects_table, drop_effects_table
from tests.flows.test_flow_versions import release

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def no_keeper(settings):
    settings.LOOM_FLOW_MODULES = ["tests.fixtures.schedule_flows"]
    installed = get_ownership()
    set_ownership(None)  # no lease keeper thread in this process
    yield
    set_ownership(installed)


@pytest.fixture
def capped():
    declare_queue("t-ops", concurrency=1)
    yield "t-ops"
    forget("t-ops")


def state(eid: str) -> str:
    return QueueEntry.objects.get(execution_id=eid).state


def test_a_paused_queue_is_not_dispatched_from_for_any_version_and_a_pending_entry_still_cancels(capped):
    create_effects_table()
    try:
        with release("ver.queued", 1):
            old = enqueue("ver.queued", {"n": 1}, queue=capped, execution_id="op-v1").execution_id
        with release("ver.queued", 2):
            new = enqueue("ver.queued", {"n": 2}, queue=capped, execution_id="op-v2").execution_id
        gone = enqueue("sched.echo", {"n": 3}, queue=capped, execution_id="op-x").execution_id
        assert pause.pause(capped, "test").changed and not pause.pause(capped, "again").changed
        assert Queue.objects.get(pk=capped).paused_by == "test"  # the first pause is kept
        store = store_for()
        for versions in ((1,), (2,), (1, 2)):
            with release("ver.queued", *versions):
                flows = registry.runnable()
                assert store.ready_queues(flows, 0.0) == [] and store.dequeue(capped, "w", 10, flows, 0.0) == []
                assert run_due() == []
        cancel(gone, reason="pause x cancel")  # a pending entry of a paused queue is cancelled as ever
        assert state(gone) == "cancelled" and Execution.objects.get(pk=gone).status == "cancelled"
        assert pause.resume(capped).changed and not pause.resume(capped).changed
        with release("ver.queued", 1, 2):
            assert sorted(run_due()) == ["completed", "completed"]  # one at a time (cap 1), each its own version
        results = dict(Execution.objects.filter(pk__in=[old, new]).values_list("id", "result"))
        assert results[old]["version"] == 1 and results[new]["version"] == 2
    finally:
        drop_effects_table()


def test_run_now_on_a_paused_queue_waits_there_and_backfill_queues_each_tick_once_under_the_cap(capped):
    sc.define("op-hourly", "0 * * * *", "sched.echo", {"n": 1}, queue=capped)
    pause.pause(capped, "test")
    eid = schedule_ops.run_now("op-hourly", "test")
    assert eid.startswith("sched:op-hourly:run:") and state(eid) == "pending"
    assert run_due() == []  # paused: the run-now waits for the resume
    start, end = datetime(2026, 1, 1, 0, 0, tzinfo=UTC), datetime(2026, 1, 1, 3, 0, tzinfo=UTC)
    first = schedule_ops.backfill("op-hourly", start, end, "test")
    assert first.started == [sc.execution_id("op-hourly", start + timedelta(hours=h)) for h in range(4)]
    again = schedule_ops.backfill("op-hourly", start - timedelta(minutes=30), end, "test")
    assert again.started == [] and again.already == first.started  # a second backfill adds nothing
    assert QueueEntry.objects.filter(queue_id=capped).count() == 5
    pause.resume(capped)
    assert run_due(limit=1) == ["completed"]
    # The cap (1) holds for the backfilled ticks: one claim at a time, each settled before the next.
    assert run_due() == ["completed"] * 4
    assert Execution.objects.filter(pk__startswith="sched:op-hourly:", status="completed").count() == 5


def test_a_backfill_does_not_run_again_the_ticks_retention_removed(capped, settings):
    """Retention frees a removed execution's id: a backfill of a range older than the flow's retention cutoff
    would find the ids free and run every removed tick again. It queues only the ticks after the cutoff and says
    how many older ones it left."""
    sc.define("op-kept", "0 * * * *", "sched.echo", {"n": 1}, queue=capped)
    old = (datetime.now(UTC) - timedelta(days=40)).replace(minute=0, second=0, microsecond=0)
    ran = schedule_ops.backfill("op-kept", old, old + timedelta(hours=2), "test").started  # no retention yet
    assert len(ran) == 3 and run_due() == ["completed"] * 3
    for h, eid in enumerate(ran):  # each finished when its tick ran, 40 days ago
        Execution.objects.filter(pk=eid).update(finished_at=old + timedelta(hours=h, minutes=1))
    settings.LOOM_RETENTION_DAYS = 30
    assert retention.run(Execution.objects.db)["executions"] == 3  # removed: their ids are free again

    recent = (datetime.now(UTC) - timedelta(days=1)).replace(minute=0, second=0, microsecond=0)
    done = schedule_ops.backfill("op-kept", old, old + timedelta(hours=2), "test")
    assert done.started == [] and done.expired == ran and done.already == []
    assert "3 tick(s) older than the retention cutoff" in done.summary()
    assert not Execution.objects.filter(pk__in=ran).exists() and not QueueEntry.objects.filter(execution_id__in=ran)
    newer = schedule_ops.backfill("op-kept", recent, recent + timedelta(hours=1), "test")  # inside the period
    assert len(newer.started) == 2 and newer.expired == [] and "retention" not in newer.summary()
    settings.LOOM_RETENTION_FLOWS = ["sched.echo=forever"]  # a flow kept forever: every tick is a real check
    again = schedule_ops.backfill("op-kept", old, old + timedelta(hours=2), "test")
    assert again.cutoff is None and again.expired == [] and again.started == ran


def test_a_drain_whose_start_note_cannot_be_written_is_still_carried_out():
    """The drain service's first write (the request's started_at) failing must not abandon the drain: the
    worker still drains, marks the request finished and stops."""
    from types import SimpleNamespace

    from django.db import DatabaseError

    Worker.objects.create(id="op-dw", host="h", pid=1)
    assert drain.request("op-dw", "test").new

    class SeenFails(drain.DrainStore):
        def seen(self, worker_id: str) -> None:
            raise DatabaseError("the note's write failed")

    stopped: list[bool] = []
    service = drain.DrainService()
    service.worker = SimpleNamespace(worker_id="op-dw", services=[service], request_stop=lambda: stopped.append(True))
    service.store = SeenFails(DrainRequest.objects.db)
    service._drain("test")
    row = DrainRequest.objects.get(worker_id="op-dw")
    assert stopped == [True] and row.finished_at is not None and row.started_at is None


def test_a_paused_schedule_does_not_tick_and_stays_paused_when_its_code_is_written_again():
    sc.define("op-every", "* * * * * *", "sched.echo", {"n": 1})
    Schedule.objects.filter(pk="op-every").update(next_tick_at=datetime.now(UTC) - timedelta(seconds=1))
    assert schedule_ops.pause("op-every", "test") and not schedule_ops.pause("op-every", "again")
    assert sc.tick() == []
    sc.define("op-every", "* * * * * *", "sched.echo", {"n": 2})  # a rewrite (as from code) keeps the pause
    assert Schedule.objects.get(pk="op-every").paused_at is not None and sc.tick() == []
    assert schedule_ops.resume("op-every")
    Schedule.objects.filter(pk="op-every").update(next_tick_at=datetime.now(UTC) - timedelta(seconds=1))
    assert len(sc.tick()) == 1


def test_the_cli_verbs_act_and_refuse_with_nothing_written(capsys, capped):
    call_command("loom", "queues", "pause", capped)
    assert "queue t-ops: paused" in capsys.readouterr().out
    call_command("loom", "queues", "--json")
    (row,) = [q for q in json.loads(capsys.readouterr().out) if q["name"] == capped]
    assert row["paused_by"] == "loom CLI" and row["paused_since"] is not None
    call_command("loom", "queues")
    assert "paused by loom CLI" in capsys.readouterr().out
    call_command("loom", "queues", "resume", capped, "--json")
    assert json.loads(capsys.readouterr().out) == {"queue": capped, "paused": False, "changed": True}
    with pytest.raises(CommandError) as refused:
        call_command("loom", "queues", "pause", "no-such-queue")
    assert refused.value.returncode == 1 and not Queue.objects.filter(pk="no-such-queue").exists()
    with pytest.raises(CommandError) as refused:
        call_command("loom", "workers", "drain", "no-such-worker")
    assert refused.value.returncode == 1 and not DrainRequest.objects.exists()
    Worker.objects.create(id="op-w", host="h", pid=1)
    call_command("loom", "workers", "drain", "op-w")
    call_command("loom", "workers", "drain", "op-w")
    out = capsys.readouterr().out
    assert "asked to drain" in out and "already asked to drain" in out
    call_command("loom", "workers", "--json")
    (row,) = [w for w in json.loads(capsys.readouterr().out) if w["id"] == "op-w"]
    assert row["drain"] == "asked (by loom CLI)" and row["leases"] == 0
    sc.define("op-cli", "0 * * * *", "sched.echo", {"n": 1}, queue=capped)
    call_command("loom", "schedules", "backfill", "op-cli", "--from", "2026-01-01T00:00", "--to", "2026-01-01T01:00",
                 "--json")
    assert len(json.loads(capsys.readouterr().out)["started"]) == 2
    with pytest.raises(CommandError) as refused:
        call_command("loom", "schedules", "backfill", "op-cli", "--from", "2026-01-02T00:00", "--to", "2026-01-01")
    assert refused.value.returncode == 1
    with pytest.raises(CommandError):
        call_command("loom", "schedules", "backfill", "op-cli", "--from", "2000-01-01T00:00", "--to", "2026-01-01")
    assert QueueEntry.objects.filter(queue_id=capped).count() == 2  # the refused ranges queued nothing
    call_command("loom", "schedules", "run-now", "op-cli")
    call_command("loom", "schedules", "pause", "op-cli")
    assert "schedule op-cli: paused" in capsys.readouterr().out


@hsettings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.one_of(st.none(), st.integers(), st.text(max_size=120)), days=st.integers(-3, 3))
@example(name="\x00", days=0)  # PostgreSQL's text refuses NUL: the refusal must still be ours, by name
def test_bad_names_and_ranges_are_refused_by_name_and_change_nothing(name, days):
    # A name that happens to exist is skipped; compared in Python, since a name PostgreSQL cannot hold (NUL)
    # would make a filter on it the database's error, not the operations'.
    if isinstance(name, str) and name in set(Queue.objects.values_list("name", flat=True)):
        return
    before = (list(Queue.objects.values_list("name", "paused_at")), DrainRequest.objects.count(),
              QueueEntry.objects.count())
    with pytest.raises(UnknownQueue):
        pause.pause(name, "h")
    with pytest.raises(drain.UnknownWorker):
        drain.request(name, "h")
    with pytest.raises(InvalidSchedule):
        schedule_ops.backfill(name, datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 1 + max(days, 0), tzinfo=UTC))
    after = (list(Queue.objects.values_list("name", "paused_at")), DrainRequest.objects.count(),
             QueueEntry.objects.count())
    assert after == before


def test_the_operations_page_shows_the_figures_and_each_button_needs_its_permission(capped):
    enqueue("sched.echo", {"n": 1}, queue=capped, execution_id="op-page-1")
    assert run_due() == ["completed"]
    enqueue("sched.echo", {"n": 2}, queue=capped, execution_id="op-page-2")
    Worker.objects.create(id="op-page-w", host="h", pid=1)
    done, _rate = operations.throughput_series("hour")
    assert sum(v for _, v in done[0].points) >= 1 and done[1].points[-1][1] == 0
    depth = {s.name: s.points[-1][1] for s in operations.depth_series("day")}
    assert depth[capped] == 1
    (row,) = [q for q in operations.queues() if q.name == capped]
    assert row.pending == 1 and row.oldest_pending is not None and row.paused == ""
    url = "/admin/queues/queue/operations/"
    viewer = User.objects.create_user("op-viewer", is_staff=True)
    viewer.user_permissions.set([Permission.objects.get(codename="view_queue")])
    pauser = User.objects.create_user("op-pauser", is_staff=True)
    pauser.user_permissions.set(Permission.objects.filter(codename__in=["view_queue", "pause_queue"]))
    client = Client()
    client.force_login(viewer)
    page = client.get(url).content.decode()
    assert "op-page-w" in page and capped in page and "loom-pause-queue" not in page and "<svg" in page
    for action, name in (("pause_queue", capped), ("drain_worker", "op-page-w"), ("run_schedule", "x")):
        assert client.post(url, {"action": action, "name": name}).status_code == 403
    client.force_login(pauser)
    assert "loom-pause-queue" in client.get(url).content.decode()
    assert client.post(url, {"action": "pause_queue", "name": capped}).status_code == 302
    assert Queue.objects.get(pk=capped).paused_by == "op-pauser (admin)"
    assert client.post(url, {"action": "drain_worker", "name": "op-page-w"}).status_code == 403
    assert not DrainRequest.objects.exists()
