"""Cron schedules (leases/schedules.py): definitions are validated before anything is written, the
catch-up policies decide which missed ticks start, and each tick starts exactly one execution however
many tickers race for it (threads here on either database; real processes: test_schedules_processes)."""

from __future__ import annotations

import itertools
import threading
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, available_timezones

import pytest
from django.db import connections
from django.utils import timezone
from django_q.models import OrmQ
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from journal.flows import UnknownFlow
from journal.flows.errors import InvalidInput
from journal.models import Execution
from leases import schedules as sc
from leases.models import Schedule, StartReservation
from tests.fixtures import schedule_flows  # noqa: F401  (registers sched.echo)

T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


def queued_ids() -> list[str]:
    """The execution ids of the starts queued on the default queue (a tick without a queue of its own):
    issue #24, every tick is a queued execution on the one leased queue, no longer a django-q2 task."""
    from queues.models import QueueEntry

    return sorted(QueueEntry.objects.filter(queue_id="default").values_list("execution_id", flat=True))


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
        header = Execution.objects.get(pk=started[0].execution_id)  # issue #24: an execution at once, queued
        assert (header.status, header.input) == ("queued", {"n": 1})  # the input, as JSON (not its text)
        assert not OrmQ.objects.exists() and not StartReservation.objects.exists()
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


# -- time zones: the cron read on a zone's wall clock, daylight saving included -------------------------
# Europe/Paris in 2026: clocks go 02:00 CET -> 03:00 CEST on Sunday March 29 (01:00 UTC) and
# 03:00 CEST -> 02:00 CET on Sunday October 25 (01:00 UTC). A tick is a UTC instant either way.
PARIS = "Europe/Paris"
DST_ZONES = ["Europe/Paris", "America/New_York", "Australia/Sydney", "America/Santiago", "Australia/Lord_Howe"]


def utc(*fields: int) -> datetime:
    return datetime(*fields, tzinfo=UTC)


def ticks_after(cron: str, after: datetime, count: int, tz: str) -> list[datetime]:
    moments = [sc.next_tick(cron, after, tz)]
    while len(moments) < count:
        moments.append(sc.next_tick(cron, moments[-1], tz))
    return moments


def test_a_paris_weekday_morning_is_nine_local_on_both_sides_of_each_dst_change():
    """`0 9 * * 1-5` in Paris is 08:00 UTC in winter and 07:00 UTC in summer."""
    assert ticks_after("0 9 * * 1-5", utc(2026, 3, 26), 3, PARIS) == [utc(2026, 3, 26, 8), utc(2026, 3, 27, 8),
                                                                       utc(2026, 3, 30, 7)]
    assert ticks_after("0 9 * * 1-5", utc(2026, 10, 22), 3, PARIS) == [utc(2026, 10, 22, 7), utc(2026, 10, 23, 7),
                                                                        utc(2026, 10, 26, 8)]


def test_a_skipped_local_time_fires_once_at_the_end_of_the_gap():
    """02:30 does not exist in Paris on March 29: the 02:30 daily tick fires at 03:00 CEST (01:00 UTC),
    once; two ticks in the gap (02:00 and 02:30) are one tick there, not two."""
    assert ticks_after("30 2 * * *", utc(2026, 3, 27, 12), 3, PARIS) == [utc(2026, 3, 28, 1, 30), utc(2026, 3, 29, 1),
                                                                          utc(2026, 3, 30, 0, 30)]
    assert ticks_after("0,30 2 * * *", utc(2026, 3, 28, 12), 3, PARIS) == [utc(2026, 3, 29, 1), utc(2026, 3, 30, 0),
                                                                            utc(2026, 3, 30, 0, 30)]


def test_a_repeated_local_time_fires_once_at_its_first_occurrence():
    """02:30 happens twice in Paris on October 25 (CEST, then CET): the daily tick fires once, at the
    first (00:30 UTC). From inside the repeated hour, after that tick, the next one is the next day's
    and the latest one is that first occurrence (cronsim alone would answer 00:30 UTC, before `after`,
    and the day before)."""
    assert ticks_after("30 2 * * *", utc(2026, 10, 24, 12), 2, PARIS) == [utc(2026, 10, 25, 0, 30),
                                                                          utc(2026, 10, 26, 1, 30)]
    inside = utc(2026, 10, 25, 1, 15)  # 02:15 CET, the second pass of the hour
    assert sc.next_tick("30 2 * * *", inside, PARIS) == utc(2026, 10, 26, 1, 30)
    assert sc.latest_tick("30 2 * * *", inside, PARIS) == utc(2026, 10, 25, 0, 30)


def test_an_elapsed_time_cron_follows_the_real_hours_through_both_changes():
    """A cron with a `*` minute or hour field (and any 6-field cron) names instants, not wall-clock
    appointments: an hourly `30 * * * *` has no 02:30 on March 29 and two on October 25, an hour
    apart, like every other hour; a 6-field `0 30 2 * * *` likewise skips March 29 and fires twice
    on October 25."""
    assert ticks_after("30 * * * *", utc(2026, 3, 29), 3, PARIS) == [utc(2026, 3, 29, 0, 30), utc(2026, 3, 29, 1, 30),
                                                                      utc(2026, 3, 29, 2, 30)]
    assert ticks_after("30 * * * *", utc(2026, 10, 25), 3, PARIS) == [utc(2026, 10, 25, 0, 30),
                                                                       utc(2026, 10, 25, 1, 30),
                                                                       utc(2026, 10, 25, 2, 30)]
    assert ticks_after("0 30 2 * * *", utc(2026, 3, 28, 12), 1, PARIS) == [utc(2026, 3, 30, 0, 30)]
    assert ticks_after("0 30 2 * * *", utc(2026, 10, 24, 12), 3, PARIS) == [utc(2026, 10, 25, 0, 30),
                                                                             utc(2026, 10, 25, 1, 30),
                                                                             utc(2026, 10, 26, 1, 30)]


@pytest.mark.parametrize(("due", "now", "policy", "expected"), [
    # Spring forward: the 28th's 02:30 CET was missed, now is 30 s after the 29th's tick (03:00 CEST).
    (utc(2026, 3, 28, 1, 30), utc(2026, 3, 29, 1, 0, 30), "skip", [utc(2026, 3, 29, 1)]),
    (utc(2026, 3, 28, 1, 30), utc(2026, 3, 29, 1, 0, 30), "once", [utc(2026, 3, 29, 1)]),
    (utc(2026, 3, 28, 1, 30), utc(2026, 3, 29, 1, 0, 30), "all", [utc(2026, 3, 28, 1, 30), utc(2026, 3, 29, 1)]),
    # Fall back: the 24th's tick was missed; now is inside the repeated hour, 45 min after the 25th's.
    (utc(2026, 10, 24, 0, 30), utc(2026, 10, 25, 1, 15), "skip", []),
    (utc(2026, 10, 24, 0, 30), utc(2026, 10, 25, 1, 15), "once", [utc(2026, 10, 25, 0, 30)]),
    (utc(2026, 10, 24, 0, 30), utc(2026, 10, 25, 1, 15), "all", [utc(2026, 10, 24, 0, 30), utc(2026, 10, 25, 0, 30)]),
])
def test_catch_up_policies_across_a_dst_change(due, now, policy, expected):
    """The catch-up policies count local days, not 24-hour spans; the next tick is after `now`, never
    the repeated hour's tick again."""
    ticks, upcoming, skipped = sc.plan("30 2 * * *", due, now, policy, 60, 100, PARIS)
    assert ticks == expected and skipped == (0 if expected else 1)
    assert upcoming == (utc(2026, 3, 30, 0, 30) if now.month == 3 else utc(2026, 10, 26, 1, 30)) and upcoming > now


def first_real_minute(day, hour: int, minute: int, tz: ZoneInfo) -> datetime:
    """The wall-clock appointment `hour:minute` on `day`: that local time (its first occurrence when it is
    repeated), or the first local minute after it that exists when the clocks skipped it."""
    naive = datetime.combine(day, datetime.min.time()).replace(hour=hour, minute=minute)
    while (aware := naive.replace(tzinfo=tz)) != aware.astimezone(UTC).astimezone(tz):  # does not exist
        naive += timedelta(minutes=1)
    return aware.astimezone(UTC)


@settings(max_examples=150, deadline=None)
@given(zone_name=st.sampled_from(DST_ZONES), hour=st.integers(0, 23), minute=st.integers(0, 59),
       start=st.datetimes(min_value=datetime(2026, 1, 1), max_value=datetime(2026, 12, 1)))
def test_a_fixed_time_cron_fires_exactly_once_per_local_day_through_every_dst_change(zone_name, hour, minute, start):
    """For any daily `M H * * *` in a zone with daylight saving (north and south, a one-hour and a
    half-hour change, one at midnight), over the 45 days from any moment of 2026: one tick per local
    day, at the appointment's first occurrence or at the end of the gap that skipped it; the ticks are
    increasing UTC instants; latest_tick finds each tick from it and from just before the next one;
    `all` catch-up over the span starts exactly those ticks."""
    tz = ZoneInfo(zone_name)
    cron = f"{minute} {hour} * * *"
    after = start.replace(tzinfo=UTC)
    moments = ticks_after(cron, after, 45, zone_name)
    first_day = after.astimezone(tz).date()
    days = [m.astimezone(tz).date() for m in moments]
    assert days == sorted(set(days)) and (days[-1] - days[0]).days == 44
    assert moments == [first_real_minute(d, hour, minute, tz) for d in days]
    assert days[0] in (first_day, first_day + timedelta(days=1))
    for earlier, later in itertools.pairwise(moments):
        assert sc.latest_tick(cron, earlier, zone_name) == earlier
        assert sc.latest_tick(cron, later - timedelta(seconds=1), zone_name) == earlier
    ticks, upcoming, _ = sc.plan(cron, moments[0], moments[-1], "all", 60, 100, zone_name)
    assert ticks == moments and upcoming > moments[-1]


def transition_days(now: datetime) -> list:
    """Paris's DST days (the last Sundays of March and October) of this year and the last."""
    days = [datetime(year, month, 31).date() for year in (now.year - 1, now.year) for month in (3, 10)]
    return [day - timedelta(days=(day.weekday() + 1) % 7) for day in days]


def latest_transitions(now: datetime) -> datetime:
    """The earlier of Paris's latest spring-forward and fall-back days at least a day before `now`, as
    UTC midnight: a span from the day before it to now crosses both."""
    recent = [day for day in transition_days(now) if now.date() - timedelta(days=366) < day < now.date()]
    return datetime.combine(min(recent[-2:]), datetime.min.time(), tzinfo=UTC)


@pytest.mark.django_db(transaction=True)
class TestTimeZones:
    def test_a_paris_schedule_ticks_on_its_wall_clock_across_both_dst_changes(self):
        """A daily 02:30 Paris schedule whose workers were down since the day before the earlier of the
        latest two DST changes: catch_up=all starts one execution per local day (the claims go on
        until nothing is due), the spring-forward day's at 03:00 CEST, the fall-back day's once at its
        first 02:30; the ids are UTC instants; the next tick is tomorrow's 02:30 in Paris."""
        now = timezone.now()
        sc.define("paris", "30 2 * * *", "sched.echo", {"tz": True}, catch_up="all", timezone=PARIS)
        row = Schedule.objects.get(pk="paris")
        assert row.timezone == PARIS
        first = sc.next_tick("30 2 * * *", latest_transitions(now) - timedelta(days=1), PARIS)
        set_back("paris", first)
        started: list[sc.Started] = []
        while batch := sc.tick():
            started.extend(batch)
        paris = ZoneInfo(PARIS)
        days = [s.tick.astimezone(paris).date() for s in started]
        assert days == [first.astimezone(paris).date() + timedelta(days=i) for i in range(len(days))]
        assert [s.tick for s in started] == [first_real_minute(d, 2, 30, paris) for d in days]
        assert started[-1].tick > now - timedelta(days=1)
        ids = [s.execution_id for s in started]
        assert queued_ids() == sorted(ids) and len(set(ids)) == len(ids)
        for change in transition_days(now):  # each DST day of the span: one id, the appointment's
            if first.date() <= change <= started[-1].tick.date():
                assert [i for i in ids if i.startswith(f"sched:paris:{change:%Y-%m-%d}")] == [
                    sc.execution_id("paris", first_real_minute(change, 2, 30, paris))]
        if datetime(2026, 10, 26, tzinfo=UTC) < now and first < datetime(2026, 3, 29, tzinfo=UTC):
            assert "sched:paris:2026-03-29T01:00:00Z" in ids and "sched:paris:2026-10-25T00:30:00Z" in ids
            assert "sched:paris:2026-10-25T01:30:00Z" not in ids
        upcoming = Schedule.objects.get(pk="paris").next_tick_at
        assert upcoming > timezone.now() and upcoming.astimezone(paris).strftime("%H:%M") in ("02:30", "03:00")

    def test_a_new_time_zone_moves_the_next_tick_and_the_same_one_keeps_it(self):
        sc.define("tz-move", "0 9 * * *", "sched.echo", now=T0, timezone=PARIS)
        assert Schedule.objects.get(pk="tz-move").next_tick_at == utc(2026, 12, 2, 8)  # 09:00 CET
        sc.define("tz-move", "0 9 * * *", "sched.echo", {"n": 2}, now=T0 + timedelta(days=3), timezone=PARIS)
        assert Schedule.objects.get(pk="tz-move").next_tick_at == utc(2026, 12, 2, 8)
        sc.define("tz-move", "0 9 * * *", "sched.echo", now=T0, timezone="America/New_York")
        assert Schedule.objects.get(pk="tz-move").next_tick_at == utc(2026, 12, 1, 14)  # 09:00 EST

    def test_the_decorator_and_sync_write_the_zone(self):
        sc.schedule("0 9 * * 1-5", flow="sched.echo", name="tz-code", timezone=PARIS)
        try:
            sc.sync_code_schedules()
            row = Schedule.objects.get(pk="tz-code")
            assert (row.source, row.timezone) == ("code", PARIS)
            assert row.next_tick_at.astimezone(ZoneInfo(PARIS)).hour == 9
        finally:
            sc.forget_code_schedule("tz-code")

    @pytest.mark.parametrize("bad", ["", "utc", "Europe/Nowhere", "europe/paris", " Europe/Paris", "Europe/Paris/",
                                     "../etc/passwd", "/etc/passwd", "localtime", "Europe/Paris\x00", "+01:00", 1,
                                     None])
    def test_an_unknown_zone_is_refused_by_every_way_in_with_nothing_written(self, bad):
        with pytest.raises(sc.InvalidSchedule, match="time zone"):
            sc.define("bad-zone", "0 9 * * *", "sched.echo", timezone=bad)
        with pytest.raises(sc.InvalidSchedule, match="time zone"):
            sc.schedule("0 9 * * *", flow="sched.echo", name="bad-zone", timezone=bad)
        assert "bad-zone" not in sc.code_schedules()
        assert not Schedule.objects.exists() and not OrmQ.objects.exists()


@pytest.mark.django_db(transaction=True)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(zone_name=st.one_of(st.sampled_from(sorted(available_timezones())), st.text(max_size=40),
                           st.sampled_from(DST_ZONES).map(str.lower),
                           st.sampled_from(DST_ZONES).map(lambda z: z + "/")))
def test_a_zone_is_written_when_zoneinfo_knows_it_and_refused_with_our_error_otherwise(zone_name):
    before = timezone.now()
    try:
        spec = sc.define("zoned", "0 9 * * *", "sched.echo", timezone=zone_name)
    except sc.InvalidSchedule as exc:
        assert "time zone" in str(exc)
        assert zone_name not in available_timezones() or zone_name == "localtime"
        assert not Schedule.objects.exists()
        return
    row = Schedule.objects.get(pk="zoned")
    assert row.timezone == spec.timezone == zone_name and zone_name != "localtime"
    assert row.next_tick_at == sc.next_tick("0 9 * * *", before, zone_name)
    Schedule.objects.filter(pk="zoned").delete()
