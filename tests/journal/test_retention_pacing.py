"""Removal's pacing and commit (journal/retention.py, docs/retention.md "Pacing"): a batch's relaxed commit
(synchronous_commit off, that transaction only), the one-statement deletes, the duty cycle between batches,
their settings refused by name before anything is removed, and an archive whose batch did not commit (rolled
back, or lost in a crash under the relaxed commit) refused by restore while the later batch's archive restores.
Both backends unless marked."""

from __future__ import annotations

import threading

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as hs

from journal import conf, retention
from journal.flows import describe, start
from journal.flows.runtime import retry
from journal.models import Execution, Removal
from journal.store import retention_store_for
from tests.admin.test_admin_executions import failed
from tests.journal.test_retention import TABLES, _flows, age, rows_of  # noqa: F401  (_flows: autouse)

pytestmark = pytest.mark.django_db


class Boom(Exception):
    """A removal hook failing after the archive object was written: the batch rolls back."""


def test_an_archive_whose_batch_did_not_commit_is_refused_and_the_later_batchs_archive_restores(settings):
    """The object is written before the batch commits. A batch that then fails (here a hook raises; under
    the relaxed commit a crash after the object does the same) removes nothing; the retried execution's
    later removal writes an archive of its own. Restoring the first object would put back a copy older than
    what was removed: it is refused whole, nothing written; the second restores."""
    settings.LOOM_ARCHIVE_FLOWS = ["*"]
    failed("rl-1")
    age("rl-1")

    def boom(ids, alias):
        raise Boom(ids)

    retention.add_remove_hook(boom)
    try:
        with pytest.raises(Boom):
            retention.remove_batch("default")
    finally:
        retention.REMOVE_HOOKS.remove(boom)
    (lost,) = retention.list_archives()
    assert rows_of("rl-1")["journal_execution"] == 1 and not Removal.objects.exists()

    retry("rl-1", handoff=True)  # what it is now differs from what the lost batch's object holds
    Execution.objects.filter(pk="rl-1").update(status="failed")
    age("rl-1")
    seen = describe("rl-1")
    assert retention.run("default")["executions"] == 1
    (kept,) = [name for name in retention.list_archives() if name != lost]
    with pytest.raises(retention.ArchiveError, match="no committed removal batch"):
        retention.restore(lost)
    with pytest.raises(CommandError, match="no committed removal batch") as refused:
        call_command("loom", "archive", "restore", lost)
    assert refused.value.returncode == 1
    assert rows_of("rl-1") == dict.fromkeys(TABLES, 0)
    call_command("loom", "archive", "restore", kept)
    assert describe("rl-1") == seen


def finished_long_ago(execution_id: str) -> None:
    """A one-step run `execution_id`, finished past retention."""
    start("waits.steps", {"n": 1}, execution_id=execution_id)
    age(execution_id)


def _seen_during_the_batch(eid: str) -> tuple[str, str]:
    """(synchronous_commit inside the batch's transaction, on the same connection after the batch)."""
    seen = []

    def look(ids, alias):
        with connection.cursor() as cursor:
            cursor.execute("SHOW synchronous_commit")
            seen.append(cursor.fetchone()[0])

    retention.add_remove_hook(look)
    try:
        assert retention.remove_batch("default").ids == [eid]
    finally:
        retention.REMOVE_HOOKS.remove(look)
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        return seen[0], cursor.fetchone()[0]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_batchs_relaxed_commit_is_its_own_transactions_only(settings):
    """SET LOCAL: the batch's transaction commits without waiting for its flush; the connection's next
    transaction (an append's, say) is back to synchronous_commit on. Off: the batch commits as appends do."""
    settings.LOOM_RETENTION_RELAXED_COMMIT = True
    finished_long_ago("rs-1")
    assert _seen_during_the_batch("rs-1") == ("off", "on")
    settings.LOOM_RETENTION_RELAXED_COMMIT = False
    finished_long_ago("rs-2")
    assert _seen_during_the_batch("rs-2") == ("on", "on")


@pytest.mark.postgres
def test_a_batch_inside_a_callers_transaction_does_not_relax_the_callers_commit(settings):
    """Inside an outer transaction (here the test's own) SET LOCAL would outlive the batch and relax the
    caller's commit, its own writes with it: the batch is then not relaxed."""
    settings.LOOM_RETENTION_RELAXED_COMMIT = True
    finished_long_ago("rs-3")
    assert _seen_during_the_batch("rs-3") == ("on", "on")


@pytest.mark.postgres
def test_the_one_statement_deletes_count_what_the_seven_statements_count(settings):
    """The PostgreSQL batch deletes in one statement (data-modifying CTEs); its counts per kind are the seven
    statements' counts (here: a removed publisher with a message and a flow event each side)."""
    from journal.flows import send, wake_due

    counts = {}
    for label, seven in (("one", False), ("seven", True)):
        eid = f"rq-{label}"
        start("waits.publisher", {}, execution_id=eid)
        send(eid, "next", {"n": 1})
        wake_due()
        age(eid)
        store = retention_store_for("default")
        if seven:
            store.DELETE_ROWS_ONE = ""
        try:
            batch = retention.remove_batch("default")
        finally:
            if seven:
                del store.DELETE_ROWS_ONE
        assert batch.ids == [eid] and rows_of(eid) == dict.fromkeys(TABLES, 0)
        counts[label] = batch.counts
    assert counts["one"] == counts["seven"]
    assert counts["one"]["messages"] == counts["one"]["flow_events"] == counts["one"]["executions"] == 1


def test_the_duty_cycle_pauses_duty_times_each_batchs_time_and_a_stop_ends_the_run(settings, monkeypatch):
    """No clock is read by the test: the run's clock is a counter (each batch takes 2 'seconds'), and its
    pauses are recorded instead of slept."""
    settings.LOOM_RETENTION_DUTY = 1.5
    for n in range(3):
        finished_long_ago(f"rp-{n}")
    ticks = iter(range(0, 1000, 2))
    monkeypatch.setattr(retention, "_clock", lambda: next(ticks))
    paused: list[float] = []
    monkeypatch.setattr(retention, "_sleep", paused.append)
    done = retention.run("default")
    assert done["executions"] == 3 and done["batches"] == 1
    assert paused == [3.0]  # 1.5 x the batch's 2 s; none after the last (empty) batch

    settings.LOOM_RETENTION_BATCH = 1
    for n in range(3):
        finished_long_ago(f"rp2-{n}")
    stop = threading.Event()
    waited: list[float] = []

    def wait(seconds: float) -> bool:
        waited.append(seconds)
        stop.set()  # the service quiesces during the first pause
        return True

    monkeypatch.setattr(stop, "wait", wait)
    assert retention.run("default", stop=stop)["executions"] == 1
    assert waited == [3.0] and Execution.objects.filter(pk__startswith="rp2-").count() == 2


BAD_DUTY = hs.one_of(hs.floats(max_value=-1e-9), hs.just(float("nan")), hs.just(float("inf")), hs.just("half"),
                     hs.just(""))
BAD_RELAXED = hs.one_of(hs.just("maybe"), hs.just("2"), hs.text(min_size=1, max_size=6).filter(
    lambda t: t.strip().lower() not in {"1", "true", "yes", "on", "0", "false", "no", "off"}))


def assert_refused(settings, execution_id: str, setting: str, bad, run) -> None:
    """An aged execution `execution_id` (started once), `setting` = `bad`: `run("default")` is a named error, nothing
    is removed, and the check at start-up (loom.E001) names the setting."""
    if not Execution.objects.filter(pk=execution_id).exists():
        finished_long_ago(execution_id)
    setattr(settings, setting, bad)
    with pytest.raises(conf.ConfigError, match=setting):
        run("default")
    assert rows_of(execution_id)["journal_execution"] == 1 and not Removal.objects.exists()
    assert any(setting in problem for problem in conf.problems())


@hsettings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bad=BAD_DUTY)
def test_a_bad_duty_is_a_named_error_and_nothing_is_removed(settings, bad):
    assert_refused(settings, "rh-1", "LOOM_RETENTION_DUTY", bad, retention.run)


@hsettings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bad=BAD_RELAXED)
def test_a_bad_relaxed_commit_is_a_named_error_and_nothing_is_removed(settings, bad):
    assert_refused(settings, "rh-2", "LOOM_RETENTION_RELAXED_COMMIT", bad, retention.remove_batch)
