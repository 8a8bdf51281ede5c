"""Retention (journal/retention.py, docs/retention.md): settled executions past their period are removed with
all their rows and nothing else; live ones, their kin, aggregate streams and flows kept forever stay; a
removal racing a retry never half-removes; archives round-trip and forget reaches them. Both backends (the
race: PostgreSQL, real commits in threads)."""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest
from django.core.files.base import ContentFile
from django.core.files.storage import FileSystemStorage
from django.core.management import call_command
from django.db import connection, connections
from django.utils import timezone

from journal import retention
from journal.envelopes import Envelope
from journal.flows import NotResumable, UnknownExecution, describe, send, start, wake_due
from journal.flows.runtime import retry
from journal.models import Event, Execution, Fence, FlowEvent, Message, Removal
from journal.privacy import FORGOTTEN, forget
from leases.retention import RetentionService
from tests.admin.test_admin_executions import failed
from tests.fixtures import privacy_fixtures as fx
from tests.fixtures import waits_flows as wf  # noqa: F401  (registers the waits.* flows)

pytestmark = pytest.mark.django_db

TABLES = ("journal_event", "journal_fence", "journal_execution", "journal_message", "journal_flowevent",
          "journal_wait", "journal_snapshot", "leases_lease", "leases_startreservation", "queues_entry")
KEYS = {"journal_event": "stream_id", "journal_fence": "stream_id", "journal_execution": "id",
        "journal_snapshot": "stream_id"}


@pytest.fixture(autouse=True)
def _flows(settings, effects, tmp_path):
    settings.LOOM_FLOW_MODULES = ["tests.fixtures.waits_flows", "tests.fixtures.admin_flows"]
    settings.LOOM_SNAPSHOT_EVERY = None
    settings.LOOM_WAIT_INLINE_MAX = 0.0
    settings.LOOM_RETENTION_DAYS = 30
    with fx.keyed_without_keeper(settings, tmp_path):
        yield


def age(execution_id: str, days: float = 40, status: str | None = None) -> None:
    """Make a header look finished `days` ago (the test's clock; the removal reads finished_at only)."""
    fields = {"finished_at": timezone.now() - timedelta(days=days)}
    if status:
        fields["status"] = status
    Execution.objects.filter(pk=execution_id).update(**fields)


def rows_of(execution_id: str) -> dict[str, int]:
    """The rows naming this execution in every table retention touches."""
    found = {}
    with connection.cursor() as cursor:
        for table in TABLES:
            cursor.execute(f"SELECT count(*) FROM {table} WHERE {KEYS.get(table, 'execution_id')} = %s", [execution_id])
            found[table] = cursor.fetchone()[0]
    return found


def everything() -> dict[str, list]:
    """Every row of every table retention touches, as text (what 'nothing else touched' compares)."""
    found = {}
    with connection.cursor() as cursor:
        for table in TABLES:
            cursor.execute(f"SELECT * FROM {table}")
            found[table] = sorted(map(repr, cursor.fetchall()))
    return found


def test_a_past_retention_execution_goes_with_all_its_rows_and_nothing_else_is_touched(settings):
    settings.LOOM_RETENTION_FLOWS = ["waits.steps=forever", "waits.sleeper=400"]
    # Removed: a settled publisher (events, a consumed message, a flow event) finished 40 days ago.
    start("waits.publisher", {}, execution_id="rt-old")
    send("rt-old", "next", {"n": 1})
    wake_due()
    assert Execution.objects.get(pk="rt-old").status == "completed"
    assert Message.objects.filter(execution_id="rt-old").exists() and FlowEvent.objects.filter(execution_id="rt-old")
    age("rt-old")
    events_old = Event.objects.filter(stream_id="rt-old").count()
    # Kept: recent; kept forever by its flow; old but under its flow's 400 days; live (waiting); a live child
    # and the settled parent that started it; an aggregate stream; a failed one still inside the period.
    start("waits.steps", {"n": 1}, execution_id="rt-new")
    start("waits.steps", {"n": 1}, execution_id="rt-forever")
    age("rt-forever", 4000)
    start("waits.sleeper", {"seconds": 3600}, execution_id="rt-sleeper")
    age("rt-sleeper", 100, status="completed")
    start("waits.receiver", {}, execution_id="rt-waiting")
    age("rt-waiting", 100)  # a finished_at on a waiting header (never happens) still does not make it due
    start("waits.parent", {"n": 1, "wait": True}, execution_id="rt-parent")
    child = Execution.objects.get(pk="rt-parent.child-0")
    assert child.status == "waiting"
    age("rt-parent", status="cancelled")  # settled, but its child is live
    Event.objects.append("RtAggregate-1", [Envelope("RtThing", {"n": 1})], expected_seq=-1)
    failed("rt-failed-new")
    before = everything()

    done = retention.run("default")

    assert rows_of("rt-old") == dict.fromkeys(TABLES, 0)
    assert done == {"batches": 1, "executions": 1, "events": events_old, "messages": 1, "flow_events": 1}
    after = everything()
    for table in TABLES:  # every other row as it was
        assert [r for r in before[table] if "'rt-old'" not in r] == after[table], table
    (record,) = Removal.objects.all()
    assert (record.ids, record.executions, record.events, record.archive) == (["rt-old"], 1, events_old, "")
    with pytest.raises(UnknownExecution):
        describe("rt-old")
    assert retention.run("default")["executions"] == 0  # nothing else is due


def test_a_child_is_kept_while_its_parent_is_live_and_both_go_once_settled():
    start("waits.parent", {"n": 2, "wait": True}, execution_id="rk-parent")
    child_id = "rk-parent.child-0"
    age(child_id, status="completed")  # settled and old, but the parent waits for it
    assert retention.run("default")["executions"] == 0
    Execution.objects.filter(pk=child_id).update(status="waiting", finished_at=None)
    send(child_id, "release", None)
    wake_due()
    wake_due()
    assert Execution.objects.get(pk="rk-parent").status == "completed"
    age(child_id)
    age("rk-parent")
    assert retention.run("default")["executions"] == 2
    assert rows_of("rk-parent") == rows_of(child_id) == dict.fromkeys(TABLES, 0)


def test_the_cli_shows_what_is_due_and_what_was_removed(capsys):
    start("waits.steps", {"n": 1}, execution_id="rc-1")
    age("rc-1")
    call_command("loom", "retention", "status", "--json")
    shown = json.loads(capsys.readouterr().out)
    assert [d["due"] for d in shown[0]["due"]] == [1]
    call_command("loom", "retention", "run")
    assert "removed 1 execution(s)" in capsys.readouterr().out
    call_command("loom", "retention", "status", "--json")
    shown = json.loads(capsys.readouterr().out)
    assert [d["due"] for d in shown[0]["due"]] == [0]
    assert shown[0]["removed"][0]["executions"] == 1


def test_an_archive_restores_the_execution_as_it_read_and_forget_reaches_the_archive(settings, capsys):
    settings.LOOM_ARCHIVE_FLOWS = ["*"]
    start("test.privacy.signup", {"customer_id": "c-arch", "email": "arch@example.org"}, execution_id="ra-1")
    age("ra-1")
    seen = describe("ra-1")
    assert seen["input"]["email"] == "arch@example.org"
    assert retention.run("default")["executions"] == 1
    with pytest.raises(UnknownExecution):
        describe("ra-1")
    (name,) = retention.list_archives()
    manifest, executions = retention.read_archive(name)
    assert (manifest["ids"], manifest["executions"]) == (["ra-1"], 1)
    raw = json.dumps(executions)
    assert "arch@example.org" not in raw and "c-arch" in raw  # sealed in the archive as in the log
    call_command("loom", "archive", "show", name)
    assert "ra-1 test.privacy.signup completed" in capsys.readouterr().out
    call_command("loom", "archive", "restore", name)
    assert describe("ra-1") == seen
    with pytest.raises(retention.ArchiveError):  # its id exists again: refused whole
        retention.restore(name)

    age("ra-1")
    assert retention.run("default")["executions"] == 1
    forget("c-arch", by="test")
    retention.restore(retention.list_archives()[-1])
    shown = describe("ra-1")
    assert shown["input"]["email"] == FORGOTTEN
    assert shown["status"] == "completed"


def test_an_archive_whose_object_was_altered_is_refused_and_nothing_is_restored(settings):
    settings.LOOM_ARCHIVE_FLOWS = ["waits.steps"]
    start("waits.steps", {"n": 1}, execution_id="rd-1")
    age("rd-1")
    retention.run("default")
    (name,) = retention.list_archives()
    storage = retention.archive_storage()
    with storage.open(name) as handle:
        data = handle.read()
    storage.delete(name)
    storage.save(name, ContentFile(data.replace(b'"completed"', b'"running"')))
    with pytest.raises(retention.ArchiveError):
        retention.restore(name)
    assert not Execution.objects.filter(pk="rd-1").exists()


def test_a_bad_flow_policy_is_a_named_error():
    for bad in (["nodays"], ["a=-1"], ["a=x"], ["a=1", "a=2"], ["=3"], ["a=inf"]):
        with pytest.raises(ValueError):
            retention.parse_flow_policies(bad)
    assert retention.parse_flow_policies(["a.b=forever", "c=1.5"]) == {"a.b": None, "c": 1.5}


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_removal_racing_a_retry_removes_all_or_nothing():
    """Real commits: a retry (its header lock, fence advance, event and header update in one transaction)
    and a removal batch (FOR UPDATE SKIP LOCKED on the header) start at a barrier; either the execution is
    wholly gone (the retry then finds nothing) or wholly there and running again (the batch skipped it)."""
    outcomes = {"removed": 0, "retried": 0}
    for round_ in range(6):
        eid = f"rr-{round_}"
        failed(eid)
        age(eid)
        barrier = threading.Barrier(2)
        errors: list[BaseException] = []

        def do_retry(eid: str = eid, gate: threading.Barrier = barrier, errors: list = errors) -> None:
            try:
                gate.wait(10)
                retry(eid, handoff=True)
            except (NotResumable, UnknownExecution):
                pass
            except BaseException as exc:
                errors.append(exc)
            finally:
                connections.close_all()

        def do_remove(gate: threading.Barrier = barrier, errors: list = errors) -> None:
            try:
                gate.wait(10)
                retention.remove_batch("default")
            except BaseException as exc:
                errors.append(exc)
            finally:
                connections.close_all()

        threads = [threading.Thread(target=do_retry), threading.Thread(target=do_remove)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert errors == []
        left = rows_of(eid)
        if left["journal_execution"] == 0:
            assert left == dict.fromkeys(TABLES, 0), left
            outcomes["removed"] += 1
        else:
            types = [e.type for e in Event.objects.read(eid)]
            assert Execution.objects.get(pk=eid).status == "running"
            assert types.count("EXECUTION_RETRIED") == 1 and types[0] == "EXECUTION_STARTED"
            assert Fence.objects.current(eid) == 2
            assert not Removal.objects.filter(ids__contains=[eid]).exists()
            outcomes["retried"] += 1
    assert sum(outcomes.values()) == 6, outcomes


def test_the_admin_lists_the_removal_batches_and_what_is_due(admin_client):
    start("waits.steps", {"n": 1}, execution_id="rm-1")
    start("waits.steps", {"n": 1}, execution_id="rm-2")
    age("rm-1")
    age("rm-2")
    page = admin_client.get("/admin/journal/removal/").content.decode()
    assert "Default: 30 day(s), 2 execution(s) due" in page
    retention.remove_batch("default", limit=1)
    page = admin_client.get("/admin/journal/removal/").content.decode()
    assert "Default: 30 day(s), 1 execution(s) due" in page
    (record,) = Removal.objects.all()
    detail = admin_client.get(f"/admin/journal/removal/{record.pk}/change/").content.decode()
    assert record.ids[0] in detail


class StorageDown(Exception):
    """A storage backend's own error (as boto's ClientError is): neither a DatabaseError nor an OSError."""


class FlakyStorage(FileSystemStorage):
    """Its first save raises StorageDown; later saves write."""

    failures = 1

    def _save(self, name, content):
        if FlakyStorage.failures:
            FlakyStorage.failures -= 1
            raise StorageDown("the bucket did not answer")
        return super()._save(name, content)


def test_the_retention_service_outlives_a_storage_backends_own_error(settings, tmp_path, caplog):
    settings.STORAGES = {**settings.STORAGES, "flaky": {"BACKEND": f"{__name__}.FlakyStorage",
                                                       "OPTIONS": {"location": str(tmp_path / "archives")}}}
    settings.LOOM_ARCHIVE_STORAGE = "flaky"
    settings.LOOM_ARCHIVE_FLOWS = ["*"]
    FlakyStorage.failures = 1
    start("waits.steps", {"n": 1}, execution_id="rf-1")
    age("rf-1")
    service = RetentionService()

    with caplog.at_level("ERROR", logger="loom.retention"):
        service._round("default")  # the storage raises: logged with its traceback, nothing removed, no raise
    (record,) = [r for r in caplog.records if r.levelname == "ERROR"]
    assert "retention batch on default failed" in record.getMessage() and record.exc_info[0] is StorageDown
    assert Execution.objects.filter(pk="rf-1").exists() and not Removal.objects.exists()

    service._round("default")  # the next round archives and removes
    assert not Execution.objects.filter(pk="rf-1").exists()
    (removal,) = Removal.objects.all()
    assert removal.ids == ["rf-1"] and removal.archive
