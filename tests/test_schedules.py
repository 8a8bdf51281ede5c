"""Cron schedules (leases/schedules.py): definitions are validated before anything is written, the
catch-up policies decide which missed ticks start, and each tick starts exactly one execution however
many tickers race for it (threads here on either database; real processes: test_schedules_processes)."""

from __future__ import annotations

import itertools
import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connections
from django.utils import timezone
from django_q.models import OrmQ
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from journal.flows import UnknownFlow
from journal.flows.errors import InvalidInput
from leases import schedules as sc
from leases.models import Schedule, StartReservation
from tests import schedule_flows  # noqa: F401  (registers sched.echo)

T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


def queued_ids() -> list[str]:
    """The execution ids of the starts queued on django-q2's ORM broker (one per task row)."""
    return sorted(task.task["args"][2] for task in OrmQ.objects.all())


def set_back(name: str, due: datetime) -> None:
    """Every worker was down: the schedule's next tick is long past (an ORM update: test set-up only)."""
    Schedule.objects.filter(pk=name).update(next_tick_at=due)


# -- the catch-up policies, pure ----------------------------------------------------------------------
def test_an_on_time_tick_runs_under_every_policy():
    for policy in sc.CATCH_UP:
        ticks, upcoming, skipped = sc.plan("*/5 * * * *", T0, T0 + timedelta(seconds=2), policy, 60, 100)
        assert ticks == [T0] and upcoming == T0 + timedelta(minutes=5) and skipped == 0


def test_skip_runs_the_latest_missed_tick_only_within_the_grace():
    now = T0 + timedelta(hours=1, seconds=30)  # 12 ticks missed, the latest 30 s ago
    assert sc.plan("*/5 * * * *", T0, now, "skip", 60, 100) == ([T0 + timedelta(hours=1)],
                                                                  T0 + timedelta(hours=1, minutes=5), 0)
    late = T0 + timedelta(hours=1, minutes=2)  # the latest is 120 s late: nothing runs
    assert sc.plan("*/5 * * * *", T0, late, "skip", 60, 100) == ([], T0 + timedelta(hours=1, minutes=5), 1)


def test_once_runs_one_execution_for_all_missed_ticks():
    now = T0 + timedelta(hours=1, minutes=2)
    assert sc.plan("*/5 * * * *", T0, now, "once", 60, 100) == ([T0 + timedelta(hours=1)],
                                                                  T0 + timedelta(hours=1, minutes=5), 0)


def test_all_runs_every_missed_tick_oldest_first_a_bounded_number_per_claim():
    now = T0 + timedelta(hours=1, minutes=2)
    ticks, upcoming, _ = sc.plan("*/5 * * * *", T0, now, "all", 60, 100)
    assert ticks == [T0 + timedelta(minutes=5 * i) for i in range(13)]
    assert upcoming == T0 + timedelta(hours=1, minutes=5)
    ticks, upcoming, _ = sc.plan("*/5 * * * *", T0, now, "all", 60, 5)
    assert ticks == [T0 + timedelta(minutes=5 * i) for i in range(5)] and upcoming == T0 + timedelta(minutes=25)


def test_a_tick_id_is_in_the_id_alphabet_and_names_schedule_and_tick():
    from journal.ids import id_problem

    eid = sc.execution_id("nightly.report", T0)
    assert eid == "sched:nightly.report:2026-12-01T12:00:00Z" and id_problem(eid) is None


# -- through the database -------------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
class TestTicks:
    def test_a_due_tick_starts_its_execution_once_and_moves_the_next_tick(self):
        sc.define("every-min", "* * * * *", "sched.echo", {"n": 1}, now=T0)
        set_back("every-min", timezone.now().replace(second=0, microsecond=0))
        started = sc.tick()
        assert [s.execution_id for s in started] == [sc.execution_id("every-min", started[0].tick)]
        assert queued_ids() == [started[0].execution_id]
        assert StartReservation.objects.filter(pk=started[0].execution_id).exists()
        assert OrmQ.objects.get().task["args"][1] == {"n": 1}  # the input, as JSON (not its text)
        row = Schedule.objects.get(pk="every-min")
        assert row.last_tick_at == started[0].tick and row.last_execution_id == started[0].execution_id
        assert row.next_tick_at > timezone.now() - timedelta(seconds=1)
        assert sc.tick() == []  # nothing due any more
        assert len(queued_ids()) == 1

    @pytest.mark.parametrize(("policy", "expected"), [("skip", 0), ("once", 1), ("all", 4)])
    def test_missed_ticks_after_downtime_follow_the_catch_up_policy(self, policy, expected):
        """A yearly schedule (New Year, 00:00 UTC) whose workers were down since three New Years before
        the latest: four ticks missed, the latest months ago (far beyond the grace)."""
        name = f"down-{policy}"
        cron = "0 0 1 1 *"
        sc.define(name, cron, "sched.echo", None, catch_up=policy)
        latest = sc.latest_tick(cron, timezone.now())
        set_back(name, latest.replace(year=latest.year - 3))
        started = sc.tick()
        assert len(started) == expected == len(queued_ids())
        assert [s.tick.year for s in started] == list(range(latest.year - 3, latest.year + 1))[-expected:][:expected]
        if policy == "once":
            assert started[0].tick == latest
        assert Schedule.objects.get(pk=name).next_tick_at == latest.replace(year=latest.year + 1)

    def test_a_disabled_schedule_does_not_tick_and_is_not_caught_up_when_enabled_again(self):
        sc.define("paused", "* * * * * *", "sched.echo", enabled=False)
        set_back("paused", timezone.now() - timedelta(hours=1))
        assert sc.tick() == []
        sc.define("paused", "* * * * * *", "sched.echo", catch_up="all")
        assert Schedule.objects.get(pk="paused").next_tick_at > timezone.now() - timedelta(seconds=1)

    def test_redefining_keeps_the_next_tick_unless_the_cron_changed(self):
        sc.define("keep", "0 3 * * *", "sched.echo", now=T0)
        first = Schedule.objects.get(pk="keep").next_tick_at
        sc.define("keep", "0 3 * * *", "sched.echo", {"changed": True}, now=T0 + timedelta(days=3))
        row = Schedule.objects.get(pk="keep")
        assert row.next_tick_at == first and row.input == {"changed": True}
        sc.define("keep", "0 4 * * *", "sched.echo", now=T0)
        assert Schedule.objects.get(pk="keep").next_tick_at == T0 + timedelta(hours=16)

    def test_a_worker_only_claims_schedules_of_flows_it_can_start(self):
        sc.define("mine", "* * * * * *", "sched.echo")
        set_back("mine", timezone.now() - timedelta(seconds=1))
        assert sc.tick(flows=["some.other.flow"]) == []
        assert len(sc.tick(flows=["sched.echo"])) == 1

    def test_a_schedule_on_a_queue_enqueues_each_tick_there(self):
        from queues import declare_queue
        from queues.declarations import forget
        from queues.models import QueueEntry

        declare_queue("sched-q", concurrency=1)
        try:
            sc.define("on-queue", "* * * * * *", "sched.echo", {"q": True}, queue="sched-q")
            set_back("on-queue", timezone.now().replace(microsecond=0) - timedelta(seconds=1))
            (started,) = sc.tick()
            entry = QueueEntry.objects.get(execution_id=started.execution_id)
            assert (entry.queue_id, entry.flow, entry.state) == ("sched-q", "sched.echo", "pending")
            assert queued_ids() == []  # not the worker cluster's plain queued start
            with pytest.raises(sc.InvalidSchedule):
                sc.define("bad-queue", "* * * * *", "sched.echo", queue="undeclared")
        finally:
            forget("sched-q")

    def test_the_minute_backstop_ticks_schedules_too(self):
        """A deployment that runs only qcluster still starts its schedules' ticks (leases.tasks.recovery_sweep)."""
        from leases.keeper import get_keeper, reset_keeper
        from leases.tasks import recovery_sweep

        sc.define("backstop", "* * * * *", "sched.echo")
        set_back("backstop", timezone.now().replace(second=0, microsecond=0))
        try:
            recovery_sweep()
        finally:
            get_keeper().shutdown()
            reset_keeper(None)
        assert [eid.startswith("sched:backstop:") for eid in queued_ids()] == [True]

    def test_code_schedules_are_written_by_sync(self):
        sc.schedule("*/10 * * * *", flow="sched.echo", name="from-code", input={"x": 1})
        try:
            assert sc.sync_code_schedules() >= 1
            row = Schedule.objects.get(pk="from-code")
            assert (row.source, row.cron, row.input) == ("code", "*/10 * * * *", {"x": 1})
        finally:
            sc.forget_code_schedule("from-code")

    def test_racing_tickers_start_each_tick_exactly_once(self):
        """Four threads tick one every-second schedule 40 times each: every due second is started by
        exactly one of them, none is lost (contiguous ticks), and one queued start per tick."""
        sc.define("race", "* * * * * *", "sched.echo", catch_up="all")
        set_back("race", timezone.now().replace(microsecond=0) - timedelta(seconds=30))
        results: list[list[sc.Started]] = [[] for _ in range(4)]
        errors: list[BaseException] = []
        barrier = threading.Barrier(4)

        def ticker(i: int) -> None:
            try:
                barrier.wait()
                for _ in range(40):
                    results[i].extend(sc.tick())
            except BaseException as exc:  # surfaced below
                errors.append(exc)
            finally:
                connections.close_all()

        threads = [threading.Thread(target=ticker, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        ids = [s.execution_id for r in results for s in r]
        assert len(ids) == len(set(ids)) >= 30
        ticks = sorted(s.tick for r in results for s in r)
        assert all((b - a) == timedelta(seconds=1) for a, b in itertools.pairwise(ticks))
        assert queued_ids() == sorted(ids)


# -- bad input: our error, nothing written ------------------------------------------------------------
CRON_FIELD = st.one_of(st.sampled_from(["*", "*/5", "0", "1-5", "61", "*/0", "a", "", "L", "1,2", "99", "-1"]),
                       st.text(max_size=4))


@pytest.mark.django_db(transaction=True)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.one_of(st.just("ok-name"), st.text(max_size=120)),
       cron=st.one_of(st.lists(CRON_FIELD, min_size=0, max_size=7).map(" ".join), st.text(max_size=30)),
       flow=st.sampled_from(["sched.echo", "no.such.flow"]),
       catch_up=st.sampled_from(["skip", "once", "all", "never", ""]),
       value=st.one_of(st.none(), st.just({"n": 1}), st.just({"bad": float("nan")}), st.just({1: "x"})))
def test_a_definition_is_written_whole_or_refused_with_our_error(name, cron, flow, catch_up, value):
    try:
        spec = sc.define(name, cron, flow, value, catch_up=catch_up)
    except (sc.InvalidSchedule, UnknownFlow, InvalidInput) as exc:
        assert str(exc)
        assert not Schedule.objects.exists() and not OrmQ.objects.exists()
        return
    row = Schedule.objects.get(pk=spec.name)
    assert (row.cron, row.flow, row.catch_up) == (" ".join(cron.split()), flow, catch_up)
    Schedule.objects.filter(pk=spec.name).delete()
