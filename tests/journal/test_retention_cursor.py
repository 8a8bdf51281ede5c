"""A run of removal batches goes on from where its previous batch ended (journal/retention.py `run`, store SINCE,
docs/retention.md step 2): whatever the batch size and however many executions finished at the same instant, a run
removes exactly what is due; a batch that rolls back does not move the run on. Both backends."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as hs

from journal import retention
from journal.models import Execution
from journal.store import retention_store_for

pytestmark = pytest.mark.django_db

FLOW = "retention.cursor"


class Boom(Exception):
    """A removal hook failing: the batch rolls back."""


def settled(ages: list[float], now) -> list[str]:
    """Settled executions of FLOW (two events each), the i-th finished `ages[i]` days before `now` (equal ages: the
    very same instant); their ids."""
    prefix = f"rc{uuid.uuid4().hex[:8]}_"
    retention_store_for().fill_settled(prefix, 0, len(ages), 2, '{"data":"x"}', 1, FLOW)
    for i, age in enumerate(ages):
        Execution.objects.filter(pk=f"{prefix}{i}").update(finished_at=now - timedelta(days=age))
    return [f"{prefix}{i}" for i in range(len(ages))]


def moment(value) -> datetime:
    """A finished_at as a backend's cursor returns it (PostgreSQL: aware; SQLite: its text, UTC) as an instant."""
    found = datetime.fromisoformat(value) if isinstance(value, str) else value
    return found if timezone.is_aware(found) else found.replace(tzinfo=UTC)


@hsettings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ages=hs.lists(hs.sampled_from([1.0, 29.0, 31.0, 40.0, 40.0, 40.0, 55.5, 400.0]), min_size=1, max_size=12),
       batch=hs.integers(min_value=1, max_value=5))
def test_a_run_removes_exactly_what_is_due_whatever_the_batch_size_and_the_ties(settings, ages, batch):
    """Batches smaller than a group of executions that finished at one instant: the next batch starts at that
    instant (>=), so none of the group is passed over; none younger than the period goes."""
    settings.LOOM_RETENTION_DAYS, settings.LOOM_RETENTION_FLOWS = 30, []
    settings.LOOM_RETENTION_BATCH, settings.LOOM_ARCHIVE_FLOWS = batch, []
    now = timezone.now()
    ids = settled(ages, now)
    done = retention.run("default", now=now)
    kept = set(Execution.objects.filter(pk__in=ids).values_list("pk", flat=True))
    assert kept == {eid for eid, age in zip(ids, ages, strict=True) if age <= 30}
    assert done["executions"] == sum(1 for age in ages if age > 30)
    assert done["batches"] == -(-done["executions"] // batch)  # every batch full but the last


def test_a_batch_that_rolls_back_leaves_its_runs_cursor_where_it_was(settings):
    settings.LOOM_RETENTION_DAYS, settings.LOOM_ARCHIVE_FLOWS = 30, []
    now = timezone.now()
    ids = settled([42, 41, 40], now)
    cursor: dict = {}

    def boom(removed, alias):
        raise Boom(removed)

    retention.add_remove_hook(boom)
    try:
        with pytest.raises(Boom):
            retention.remove_batch("default", now, limit=2, cursor=cursor)
    finally:
        retention.REMOVE_HOOKS.remove(boom)
    assert cursor == {} and Execution.objects.filter(pk__in=ids).count() == 3
    assert retention.remove_batch("default", now, limit=2, cursor=cursor).ids == ids[:2]
    (bound,) = cursor.values()  # the newest the batch locked: the second oldest (as the database gave it)
    assert moment(bound) == now - timedelta(days=41)
    assert retention.remove_batch("default", now, limit=2, cursor=cursor).ids == ids[2:]
