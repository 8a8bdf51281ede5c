"""The worker's surroundings on either database: queued starts (ids, idempotent deliveries), the
recovery backstop's django-q2 options, the broker checks, the read-only leases admin, the workers
page (roles, alive or gone, pruning) and the executions under recovery."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone
from django_q.brokers import get_broker
from django_q.models import OrmQ, Schedule, Task
from django_q.signing import SignedPackage

from journal.envelopes import Envelope
from journal.flows import InvalidInput, UnknownFlow
from journal.models import Event, Execution
from leases import keeper as keeper_module
from leases.keeper import LeaseKeeper, reset_keeper
from leases.models import Lease, Worker
from leases.recovery import prune_workers
from leases.store import store_for
from leases.tasks import SCHEDULE_NAME, enqueue_start, ensure_schedule, run_start
from tests.fixtures.lease_flows import create_effects_table, effects, queue_old_scheme_start

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _fresh_keeper():
    """Queued starts run here take leases through the process's keeper: stop its thread while the
    test database still exists, and start the next test with a fresh one."""
    yield
    for keeper in keeper_module.keepers():
        keeper.shutdown(5)
    reset_keeper(None)


def queued() -> list[dict]:
    return [SignedPackage.loads(row.payload) for row in OrmQ.objects.all()]


def running(eid: str, flow: str = "leases.noop") -> str:
    Event.objects.open_stream(eid, Envelope("EXECUTION_STARTED", {"flow": flow, "input": {}}))
    Execution.objects.create(id=eid, flow=flow)
    return eid


# -- queued starts ---------------------------------------------------------------------------------

def test_enqueue_start_returns_the_execution_id_not_the_task_id():
    """Without an execution_id the id is minted at enqueue time and returned. Issue #24: enqueue_start is
    queues.enqueue on the default queue: the execution exists at once (queued), no django-q2 task is made,
    and a dispatcher (run_due here) runs it."""
    from queues import run_due

    eid = enqueue_start("leases.noop", {})
    given = enqueue_start("leases.noop", {}, execution_id="chosen-1")
    assert given == "chosen-1" and not queued()
    assert Execution.objects.get(id=eid).status == "queued"  # queued, not started
    assert sorted(run_due()) == ["completed", "completed"]
    assert Execution.objects.get(id=eid).status == "completed"


def test_a_bad_queued_start_is_refused_to_the_caller_and_nothing_is_queued():
    with pytest.raises(UnknownFlow):
        enqueue_start("no.such.flow", {})
    with pytest.raises(InvalidInput):
        enqueue_start("leases.noop", {"x": float("nan")})
    with pytest.raises(InvalidInput):
        enqueue_start("leases.noop", {}, execution_id="bad\nid")
    assert not OrmQ.objects.exists()


def test_a_second_delivery_of_a_queued_start_runs_nothing():
    """The broker re-delivers a task whose worker died (Q_CLUSTER retry). An old-scheme task (queued before
    issue #24) is routed into the queue: the first delivery queues its execution, the second finds it and
    does nothing, and the dispatcher runs it once: each step's effect exists once."""
    from queues import run_due

    create_effects_table()
    queue_old_scheme_start("leases.steps", {"n": 3, "pause": 0}, "old-steps")
    (task,) = queued()
    first = run_start(*task["args"])
    second = run_start(*task["args"])
    assert first == {"execution_id": "old-steps", "status": "queued", "duplicate": False}
    assert second == {"execution_id": "old-steps", "status": "queued", "duplicate": True}
    assert run_due() == ["completed"] and run_due() == []
    assert run_start(*task["args"])["duplicate"] is True  # a third delivery, after the run: nothing
    assert [e for e in effects() if e[0] == "old-steps"] == [("old-steps", f"s00{n}") for n in range(3)]


def test_queued_starts_and_recoveries_are_logged_with_id_flow_fence_and_duration(caplog):
    from queues import run_due

    queue_old_scheme_start("leases.noop", {}, "old-noop")
    (task,) = queued()
    with caplog.at_level(logging.INFO, logger="loom"):
        run_start(*task["args"])
        run_start(*task["args"])
        run_due()
    lines = [r.getMessage() for r in caplog.records if r.name in ("loom.worker", "loom.queues")]
    assert "old-scheme start execution=old-noop flow=leases.noop: queued on default" in lines
    assert any(line.startswith("duplicate execution=old-noop") for line in lines)
    assert any(line.startswith("completed execution=old-noop flow=leases.noop attempt=1 duration=") for line in lines)


def test_the_recovery_backstop_saves_no_successes_in_django_q2():
    """The every-minute backstop task must not flood django-q2's success list: its schedule
    carries save=False, and django-q2's monitor then records nothing for a success."""
    from django_q.monitor import save_task
    from django_q.scheduler import scheduler

    ensure_schedule()
    ensure_schedule()  # idempotent, and it updates a schedule made by an older version
    Schedule.objects.filter(name=SCHEDULE_NAME).update(next_run=timezone.now() - timedelta(seconds=5))
    scheduler(broker=get_broker())
    (task,) = queued()
    assert task["func"] == "leases.tasks.recovery_sweep"
    assert task["save"] is False and task["timeout"] == -1
    task.update(result=0, success=True, stopped=task["started"])
    save_task(task, get_broker())
    assert not Task.objects.exists()



def test_workers_that_started_at_once_and_both_made_the_backstop_schedule_do_not_fail_the_next_start():
    """Before: four loom_worker processes started together on a fresh database; two each created the schedule
    (django-q2's Schedule.name is not unique) and the next worker's start failed with MultipleObjectsReturned."""
    Schedule.objects.create(name=SCHEDULE_NAME, func="leases.tasks.recovery_sweep", schedule_type=Schedule.MINUTES)
    Schedule.objects.create(name=SCHEDULE_NAME, func="leases.tasks.recovery_sweep", schedule_type=Schedule.MINUTES)
    ensure_schedule()
    (row,) = Schedule.objects.filter(name=SCHEDULE_NAME)
    assert row.minutes == 1 and row.repeats == -1 and "save" in row.kwargs

# -- broker checks ---------------------------------------------------------------------------------

def loom_checks() -> dict[str, str]:
    return {m.id: m.msg for m in run_checks() if (m.id or "").startswith("loom.") and m.id[5:6] in "EW"}


@pytest.mark.parametrize("cluster", [None, {"name": "x"}, {"name": "x", "orm": "nope"}],
                         ids=["unset", "no-broker", "unknown-alias"])
def test_a_missing_broker_is_a_system_check_error_and_loom_worker_refuses_to_start(settings, cluster):
    if cluster is None:
        del settings.Q_CLUSTER
    else:
        settings.Q_CLUSTER = cluster
    found = loom_checks()
    assert "loom.E110" in found, found
    with pytest.raises(CommandError, match=r'Q_CLUSTER = \{"name": "loom", "orm": "default"'):
        call_command("loom_worker", skip_checks=True)


def test_the_broker_checks_warn_of_a_long_retry_and_a_timeout_not_below_it(settings):
    settings.LOOM_LEASE_TTL = 30.0
    settings.Q_CLUSTER = {"name": "x", "orm": "default", "timeout": 30, "retry": 40}
    assert not {"loom.E110", "loom.W112", "loom.W113"} & set(loom_checks())
    settings.Q_CLUSTER = {"name": "x", "orm": "default", "timeout": 300, "retry": 360}
    found = loom_checks()
    assert "loom.W112" in found and "loom.E110" not in found
    settings.Q_CLUSTER = {"name": "x", "orm": "default", "timeout": 50, "retry": 50}
    assert "loom.W113" in loom_checks()


# -- admin -----------------------------------------------------------------------------------------

def test_the_read_only_leases_admin_pages_refuse_delete_to_a_superuser(admin_client):
    """Leases, workers and execution headers (executions under recovery) cannot be deleted from
    the leases admin, neither one by one nor with the "delete selected" action."""
    eid = running("ro-1")
    Execution.objects.filter(id=eid).update(status="stuck")
    keeper = LeaseKeeper("ro-node", autostart=False)
    keeper.begin_eager(eid, 1, wait=False)
    keeper.step()
    pages = {"lease": eid, "worker": "ro-node", "recoveryview": eid}
    for model, pk in pages.items():
        listing = admin_client.get(f"/admin/leases/{model}/")
        assert listing.status_code == 200
        assert "delete_selected" not in listing.content.decode(), model
        assert admin_client.get(f"/admin/leases/{model}/{pk}/delete/").status_code == 403, model
        assert admin_client.post(f"/admin/leases/{model}/{pk}/delete/", {"post": "yes"}).status_code == 403, model
        admin_client.post(f"/admin/leases/{model}/", {"action": "delete_selected", "_selected_action": [pk],
                                                       "post": "yes"})
        assert admin_client.get(f"/admin/leases/{model}/add/").status_code == 403, model
    assert Lease.objects.filter(execution_id=eid).exists()
    assert Worker.objects.filter(id="ro-node").exists()
    assert Execution.objects.filter(id=eid).exists()


def test_executions_under_recovery_lists_only_expired_orphaned_or_stuck_ones_now(admin_client, settings):
    """Issue #28: "under recovery" means now; one recovered once and settled since is not listed."""
    settings.LOOM_LEASE_TTL = 30.0
    healthy, expired, recovered, stuck, fresh = (running(f"rv-{n}") for n in
                                                 ("healthy", "expired", "recovered", "stuck", "fresh"))
    Execution.objects.filter(id=recovered).update(status="completed", recoveries=1)
    Execution.objects.filter(id=stuck).update(status="stuck")
    keeper = LeaseKeeper("rv-node", autostart=False)
    for eid in (healthy, expired):
        keeper.begin_eager(eid, 1, wait=False)
    keeper.step()
    store_for().expire_many("rv-node", [(expired, 1)])
    page = admin_client.get("/admin/leases/recoveryview/").content.decode()
    listed = {eid for eid in (healthy, expired, recovered, stuck, fresh) if f">{eid}<" in page}
    assert listed == {expired, stuck}  # a live lease or a fresh lazy run is healthy; a recovered one settled


def test_the_workers_page_shows_role_and_alive_or_gone_and_old_rows_are_pruned(admin_client, settings):
    settings.LOOM_LEASE_TTL = 30.0
    settings.LOOM_WORKER_RETENTION = 3600.0
    store = store_for()
    store.touch_worker("w-main", "h", 1, "main")
    store.touch_worker("w-main/2", "h", 2, "django-q2 child")
    store.touch_worker("w-old", "h", 3, "main")
    store.touch_worker("w-old-holder", "h", 4, "main")
    store.stop_worker("w-main/2")
    Worker.objects.filter(id__in=["w-old", "w-old-holder"]).update(seen_at="2000-01-01T00:00:00Z")
    keeper = LeaseKeeper("w-old-holder", autostart=False)
    keeper.begin_eager(running("wp-1"), 1, wait=False)
    keeper.step()
    Worker.objects.filter(id="w-old-holder").update(seen_at="2000-01-01T00:00:00Z")
    page = admin_client.get("/admin/leases/worker/").content.decode()
    for text in ("django-q2 child", "alive", "stopped", "gone (silent"):
        assert text in page, text
    assert prune_workers() == 1
    assert set(Worker.objects.values_list("id", flat=True)) == {"w-main", "w-main/2", "w-old-holder"}


def test_a_django_q2_child_of_a_loom_worker_has_its_own_id_and_role(monkeypatch, settings):
    """A forked child of a loom_worker main gets <main id>/<pid> and role "django-q2 child", even
    when LOOM_WORKER_ID names the main (so each process has its own row)."""
    settings.LOOM_WORKER_ID = "named-main"
    monkeypatch.setattr(keeper_module, "_role", keeper_module.CALLER)
    monkeypatch.setattr(keeper_module, "_main_id", None)
    keeper_module.set_main("named-main")
    keeper_module._after_fork_in_child()  # what os.fork() runs in the child
    assert keeper_module.process_role() == "django-q2 child"
    child_id = keeper_module.node_identity()
    assert child_id.startswith("named-main/")
    LeaseKeeper(child_id, autostart=False).register()
    assert Worker.objects.get(id=child_id).role == "django-q2 child"


def test_the_broker_checks_warn_of_redis_at_most_once_delivery_and_of_max_attempts(settings):
    """A start that raised (a database restart, a worker without the flow) was acknowledged after one failure
    with max_attempts 1 and lost; Redis never acknowledges, so a start taken by a dying worker is lost."""
    settings.LOOM_LEASE_TTL = 30.0
    settings.Q_CLUSTER = {"name": "x", "orm": "default", "timeout": 30, "retry": 40, "max_attempts": 0}
    assert not {"loom.W114", "loom.W115"} & set(loom_checks())
    settings.Q_CLUSTER = {"name": "x", "orm": "default", "timeout": 30, "retry": 40, "max_attempts": 1}
    assert "loom.W115" in loom_checks()
    settings.Q_CLUSTER = {"name": "x", "redis": "redis://127.0.0.1:6379/0", "timeout": 30, "retry": 40}
    assert "loom.W114" in loom_checks()


def test_the_demo_site_never_acknowledges_a_failed_queued_start():
    from loomsite import settings as site

    assert site.Q_CLUSTER["max_attempts"] == 0


@pytest.mark.parametrize("max_attempts, kept", [(None, True), (1, False)], ids=["as-configured", "one-attempt"])
def test_a_queued_start_that_raised_stays_in_the_orm_queue_for_another_worker(monkeypatch, max_attempts, kept):
    """django-q2's monitor, on a real ORM-broker task whose run raised UnknownFlow (a worker deployed
    without the flow): with the site's max_attempts (0) the task is not acknowledged, so the broker
    delivers it again after `retry`; with max_attempts 1 (the old setting) it was acknowledged and lost."""
    import queue

    from django.utils import timezone
    from django_q.brokers import get_broker
    from django_q.conf import Conf
    from django_q.models import OrmQ
    from django_q.monitor import monitor
    from django_q.signing import SignedPackage

    from journal.flows import UnknownFlow
    from leases.tasks import run_start

    if max_attempts is not None:
        monkeypatch.setattr(Conf, "MAX_ATTEMPTS", max_attempts)
    assert (0 if max_attempts is None else max_attempts) == Conf.MAX_ATTEMPTS
    queue_old_scheme_start("calc.add", {"a": 1, "b": 2}, "raised-1")  # a task queued before issue #24
    broker = get_broker()
    [(ack_id, payload)] = broker.dequeue()
    task = SignedPackage.loads(payload)
    monkeypatch.setattr("journal.flows.registry._REGISTRY", {})  # this worker lacks the flow
    task["started"] = timezone.now()
    with pytest.raises(UnknownFlow) as raised:
        run_start(*task["args"], **task["kwargs"])
    task.update(result=str(raised.value), success=False, stopped=timezone.now(), ack_id=ack_id)
    results: queue.Queue = queue.Queue()
    results.put(task)
    results.put("STOP")
    monitor(results, broker)
    assert OrmQ.objects.filter(pk=ack_id).exists() is kept
