"""The schedule part of the lease store contract (leases.store.base.ScheduleStatements), mixed into
LeaseStoreContract: upsert by name, the claim of due schedules under a lock, the advance."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

from django.db import connections, transaction
from django.utils import timezone

from leases.models import Schedule
from leases.store.base import ScheduleWrite

COVERS = {"save_schedule": "save_schedule", "claim_due_schedules": "claim_due_schedules",
          "advance_schedule": "advance_schedule", "delete_schedules": "delete_schedules"}


def write(name: str, due: datetime, cron: str = "* * * * *", flow: str = "conformance.flow", enabled: bool = True,
          data: str = '{"n": 1}') -> ScheduleWrite:
    return ScheduleWrite(name, cron, flow, data, "skip", "", enabled, "code", due)


class SchedulesContract:
    """Mixed into LeaseStoreContract (real commits, the `store` fixture of the backend under test)."""

    def test_a_saved_schedule_that_is_due_is_claimed_with_its_input_and_an_aware_tick(self, store):
        past = timezone.now().replace(microsecond=0) - timedelta(minutes=1)
        store.save_schedule(write("due", past))
        store.save_schedule(write("later", past + timedelta(days=1)))
        store.save_schedule(write("off", past, enabled=False))
        with transaction.atomic():
            now, due = store.claim_due_schedules(10)
        assert [d.name for d in due] == ["due"]
        assert due[0].input == {"n": 1} and due[0].next_tick_at == past and due[0].next_tick_at.tzinfo is not None
        assert now >= past and now.tzinfo is not None

    def test_a_claim_only_takes_the_flows_it_is_given_and_at_most_limit_oldest_first(self, store):
        past = timezone.now() - timedelta(minutes=5)
        for i in range(3):
            store.save_schedule(write(f"s{i}", past + timedelta(seconds=i), flow="a" if i else "b"))
        with transaction.atomic():
            assert [d.name for d in store.claim_due_schedules(1)[1]] == ["s0"]
        with transaction.atomic():
            assert [d.name for d in store.claim_due_schedules(10, ["a"])[1]] == ["s1", "s2"]

    def test_an_update_keeps_the_next_tick_unless_the_cron_changed_or_it_is_enabled_again(self, store):
        first = datetime(2030, 1, 1, tzinfo=UTC)
        store.save_schedule(write("u", first))
        store.save_schedule(write("u", first + timedelta(days=1), data='{"n": 2}'))
        row = Schedule.objects.get(pk="u")
        assert row.next_tick_at == first and row.input == {"n": 2}
        store.save_schedule(write("u", first + timedelta(days=2), cron="0 * * * *"))
        assert Schedule.objects.get(pk="u").next_tick_at == first + timedelta(days=2)
        store.save_schedule(write("u", first + timedelta(days=3), cron="0 * * * *", enabled=False))
        store.save_schedule(write("u", first + timedelta(days=4), cron="0 * * * *"))
        assert Schedule.objects.get(pk="u").next_tick_at == first + timedelta(days=4)

    def test_the_time_zone_is_saved_and_claimed_and_a_new_one_replaces_the_next_tick(self, store):
        past = timezone.now().replace(microsecond=0) - timedelta(minutes=1)
        store.save_schedule(ScheduleWrite("tz", "0 9 * * *", "conformance.flow", "{}", "skip", "", True, "code",
                                          past, "Europe/Paris"))
        with transaction.atomic():
            (due,) = store.claim_due_schedules(10)[1]
        assert (due.name, due.timezone, due.next_tick_at) == ("tz", "Europe/Paris", past)
        store.save_schedule(ScheduleWrite("tz", "0 9 * * *", "conformance.flow", "{}", "skip", "", True, "code",
                                          past + timedelta(days=1), "Europe/Paris"))
        assert Schedule.objects.get(pk="tz").next_tick_at == past
        store.save_schedule(ScheduleWrite("tz", "0 9 * * *", "conformance.flow", "{}", "skip", "", True, "code",
                                          past + timedelta(days=2), "Asia/Tokyo"))
        row = Schedule.objects.get(pk="tz")
        assert (row.timezone, row.next_tick_at) == ("Asia/Tokyo", past + timedelta(days=2))

    def test_the_advance_moves_the_next_and_last_tick(self, store):
        past = timezone.now().replace(microsecond=0) - timedelta(minutes=1)
        store.save_schedule(write("adv", past))
        with transaction.atomic():
            store.claim_due_schedules(10)
            store.advance_schedule("adv", past + timedelta(hours=1), past, "sched:adv:x")
        row = Schedule.objects.get(pk="adv")
        assert (row.next_tick_at, row.last_tick_at, row.last_execution_id) == (
            past + timedelta(hours=1), past, "sched:adv:x")
        with transaction.atomic():
            store.advance_schedule("adv", past + timedelta(hours=2), None, None)  # nothing started: last kept
        row = Schedule.objects.get(pk="adv")
        assert (row.next_tick_at, row.last_tick_at) == (past + timedelta(hours=2), past)

    def test_a_second_claimer_never_gets_a_schedule_the_first_holds_and_advances(self, store):
        """The first claimer holds the row and advances it; a claim from another connection meanwhile
        (PostgreSQL: skips the locked row; SQLite: waits for the write lock, then finds it not due)."""
        past = timezone.now() - timedelta(minutes=1)
        store.save_schedule(write("held", past))
        claimed, seen = threading.Event(), []

        def second() -> None:
            try:
                claimed.wait(10)
                with transaction.atomic():
                    seen.extend(d.name for d in self.make_store().claim_due_schedules(10)[1])
            finally:
                connections.close_all()

        other = threading.Thread(target=second)
        other.start()
        with transaction.atomic():
            assert [d.name for d in store.claim_due_schedules(10)[1]] == ["held"]
            store.advance_schedule("held", past + timedelta(days=1), past, "x")
            claimed.set()
            other.join(0.5)
        other.join(10)
        assert seen == []

    def test_delete_schedules_removes_only_its_prefix(self, store):
        store.save_schedule(write("bench-1", timezone.now()))
        store.save_schedule(write("keep-1", timezone.now()))
        assert store.delete_schedules("bench-") == 1
        assert list(Schedule.objects.values_list("name", flat=True)) == ["keep-1"]
