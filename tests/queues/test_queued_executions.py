"""Issue #24: a queued start is an execution from the moment it is accepted, on both backends.

Every door (the HTTP API, start(queue=), queues.enqueue, cron ticks, hand-overs, old-scheme django-q2 tasks)
writes the execution (status queued, its input sealed like any start's) and one entry in one transaction;
from then on it is shown, cancelled, messaged and given events on every surface, and a worker's dispatcher
(queues.run_due here, in this process) begins it under its fence, once.
"""

from __future__ import annotations

import io
import json
from typing import Annotated

import pytest
from django.core.management import call_command
from django.db import connection
from pydantic import BaseModel

from journal.flows import cancel, describe, flow, get_event, hand_over, send, start
from journal.models import Event, Execution
from journal.privacy import Sensitive
from leases.models import StartReservation
from queues import declare_queue, enqueue, run_due
from queues.declarations import forget as forget_queue
from queues.models import QueueEntry
from queues.store import store_for
from queues.store.base import NewEntry
from tests.fixtures import privacy_fixtures as fx
from tests.fixtures import queue_flows  # noqa: F401  (registers the flows)

TOKEN = "ops-token-0123456789abcdef"


@flow("queues.test.seen", input_model=fx.Signup)
def seen(ctx, value):
    """Returns the e-mail address its run received, in its (unmarked) result: what the run was given."""
    return {"seen": value.email}


@pytest.fixture(autouse=True, scope="module")
def stop_the_process_lease_keeper():
    yield
    from leases.keeper import get_keeper, reset_keeper

    get_keeper().shutdown()
    reset_keeper(None)


@pytest.fixture
def api(settings):
    settings.LOOM_API_AUTH = True
    settings.LOOM_API_TOKENS = [{"token": TOKEN, "name": "ops"}]


def post(client, path: str, body: dict, token: str = TOKEN):
    return client.post(path, data=json.dumps(body), content_type="application/json",
                       headers={"Authorization": f"Bearer {token}"})


def steps_run(eid: str) -> int:
    return Event.objects.filter(stream_id=eid, type="STEP_STARTED").count()


@pytest.mark.django_db
def test_a_start_the_api_answered_queued_is_shown_messaged_and_cancelled_everywhere_at_once(client, api):
    """Before: `loom executions show/cancel` said "does not exist", cancel/send/get_event raised
    UnknownExecution and POST .../messages answered 404 until a worker began the start."""
    path = "/api/flows/queues.test.inbox/executions"
    assert post(client, path, {"input": {}, "execution_id": "qa-1"}).json()["status"] == "queued"
    assert post(client, path, {"input": {}, "execution_id": "qa-2"}).status_code == 202
    out = io.StringIO()
    call_command("loom", "executions", "show", "qa-1", stdout=out)
    assert "queued" in out.getvalue()
    shown = client.get("/api/executions/qa-1", headers={"Authorization": f"Bearer {TOKEN}"})
    assert (shown.status_code, shown.json()["status"]) == (200, "queued")
    assert get_event("qa-1", "got", default="unset") == "unset"
    sent = post(client, "/api/executions/qa-1/messages", {"topic": "go", "payload": {"from": "api"}})
    assert sent.status_code == 202, sent.content
    send("qa-1", "other", {"from": "code"})
    call_command("loom", "executions", "cancel", "qa-2", stdout=io.StringIO())
    assert Execution.objects.get(pk="qa-2").status == "cancelled"
    assert QueueEntry.objects.get(execution_id="qa-2").state == "cancelled"
    assert run_due() == ["completed"]  # qa-1 only: the cancelled start never runs
    assert steps_run("qa-2") == 0 and run_due() == []
    assert Execution.objects.get(pk="qa-1").result == {"from": "api"}  # the message waited for it
    assert get_event("qa-1", "got") == {"from": "api"}


@pytest.mark.django_db
def test_a_queued_execution_cancelled_after_its_claim_never_runs_and_frees_its_slot():
    declare_queue("t-claimed", concurrency=1)
    try:
        queued = enqueue("queues.test.double", {"n": 1}, queue="t-claimed")
        waiting = enqueue("queues.test.double", {"n": 2}, queue="t-claimed")
        (claimed,) = store_for().dequeue("t-claimed", "w", 10, ["queues.test.double"], 3600)
        assert cancel(queued.execution_id).status == "cancelled"
        from queues.service import run_claimed

        assert run_claimed(claimed) == "cancelled" and steps_run(queued.execution_id) == 0
        assert run_due() == ["completed"]
        assert Execution.objects.get(pk=waiting.execution_id).status == "completed"
    finally:
        forget_queue("t-claimed")


@pytest.mark.django_db
def test_a_claim_offered_again_runs_its_queued_execution_once_the_fence_decides():
    """Two claims of one entry (the first believed lost, offered again): the second begins it, the first's
    late begin is refused by the entry; and a begin that got past the entry (an adopted claim) is refused
    by the fence, so the flow runs once."""
    from journal.flows.queued import run_queued

    eid = enqueue("queues.test.double", {"n": 4}).execution_id
    assert run_queued(eid, "queues.test.double", lambda: True).status == "completed"
    assert run_queued(eid, "queues.test.double", lambda: True) == "completed"  # the header's status: not run
    assert steps_run(eid) == 1


@pytest.mark.django_db
def test_the_recovery_sweep_and_the_waker_leave_a_queued_execution_alone():
    from journal.flows import wake_due
    from leases.recovery import sweep

    eid = enqueue("queues.test.double", {"n": 1}, execution_id="qa-alone").execution_id
    Execution.objects.filter(pk=eid).update(updated_at="2000-01-01T00:00:00Z")  # as old as can be
    taken = sweep("sweeper")
    assert eid not in {t[0] for t in taken.taken}
    assert wake_due() == [] and Execution.objects.get(pk=eid).status == "queued"


@pytest.mark.django_db
def test_a_repeated_api_start_is_200_to_its_starter_404_to_a_token_that_may_not_read_it_else_409(client, settings):
    """Issue #25: answered by flow and starter, never by comparing the guessed input with the stored one."""
    alice, bob, admin = "alice-token-0123456789abcdef", "bob-token-0123456789abcdef", "root-token-0123456789abcdef"
    settings.LOOM_API_AUTH = True
    settings.LOOM_API_TOKENS = [{"token": alice, "name": "alice", "read": "own"},
                                {"token": bob, "name": "bob", "read": "own"}, {"token": admin, "name": "root"}]
    path = "/api/flows/queues.test.double/executions"
    assert post(client, path, {"input": {"n": 1}, "execution_id": "qr"}, alice).status_code == 202
    guess = post(client, path, {"input": {"n": 7}, "execution_id": "qr"}, alice)  # her own, another input
    assert (guess.status_code, guess.json()["created"], guess.json()["status"]) == (200, False, "queued")
    assert post(client, path, {"input": {"n": 1}, "execution_id": "qr"}, bob).status_code == 404  # as GET
    assert post(client, path, {"input": {"n": 1}, "execution_id": "qr"}, admin).status_code == 409  # not his
    other = post(client, "/api/flows/queues.test.nap/executions", {"input": {}, "execution_id": "qr"}, alice)
    assert other.status_code == 409
    assert QueueEntry.objects.filter(execution_id="qr").count() == 1
    assert Event.objects.filter(stream_id="qr").count() == 1  # nothing written by the repeats


@pytest.mark.django_db
def test_every_door_takes_the_queue_options(client, api):
    declare_queue("t-doors", concurrency=5)
    try:
        body = {"input": {"n": 2}, "execution_id": "qd-api", "queue": "t-doors", "partition_key": "p",
                "priority": 7, "dedup_id": "d-api", "delay": 3600, "timeout": 60}
        assert post(client, "/api/flows/queues.test.double/executions", body).status_code == 202
        entry = QueueEntry.objects.get(execution_id="qd-api")
        assert (entry.queue_id, entry.partition_key, entry.priority, entry.dedup_id) == ("t-doors", "p", 7, "d-api")
        started = Event.objects.read("qd-api")[0].payload
        assert started["$queue"]["queue"] == "t-doors" and "$deadline" in started
        code = start("queues.test.double", {"n": 3}, queue="t-doors", timeout=30, execution_id="qd-code")
        assert code.status == "queued" and "$deadline" in Event.objects.read("qd-code")[0].payload
        bad = post(client, "/api/flows/queues.test.double/executions", {"input": {"n": 1}, "queue": "nope"})
        assert bad.status_code == 400 and not QueueEntry.objects.filter(queue_id="nope").exists()
    finally:
        forget_queue("t-doors")


@pytest.mark.django_db
def test_a_hand_over_is_a_resume_entry_on_the_executions_queue_run_once_from_its_fence():
    """Before: a django-q2 task, outside every cap and needing the cluster. Now a resume entry on the
    execution's own queue (the default one for an execution started directly)."""
    from journal.models import Fence

    eid = enqueue("queues.test.double", {"n": 5}, execution_id="qh-1").execution_id
    assert run_due() == ["completed"]
    Execution.objects.filter(pk=eid).update(status="running")  # as if its worker died before the settle
    Event.objects.filter(stream_id=eid, seq__gt=1).delete()  # (its last write lost: step started only)
    token = hand_over(eid, force=True)
    entry = QueueEntry.objects.get(execution_id=eid)
    assert (entry.state, entry.resume_fence, entry.queue_id) == ("pending", token, "default")
    assert run_due() == ["completed"] and run_due() == []
    assert Fence.objects.current(eid) == token + 1
    with pytest.raises(Exception, match="queued"):
        hand_over(enqueue("queues.test.double", {"n": 1}).execution_id)


@pytest.mark.django_db
def test_an_old_scheme_django_q2_start_and_an_old_style_entry_each_run_exactly_once(monkeypatch):
    """Written before issue #24: a django-q2 task `leases.tasks.run_start` with its reservation, and a queue
    entry with the input in its row and no execution header. Each runs once after the upgrade."""
    from django_q.models import OrmQ

    from leases.tasks import run_start
    from tests.fixtures.lease_flows import queue_old_scheme_start

    queue_old_scheme_start("queues.test.double", {"n": 10}, "qo-task")
    task = OrmQ.objects.get().task
    assert run_start(*task["args"], **task["kwargs"])["status"] == "queued"
    assert run_start(*task["args"], **task["kwargs"])["duplicate"] is True  # delivered twice
    assert not StartReservation.objects.exists()
    # An entry as queues.enqueue wrote it before: the input in the row, no execution.
    store_for().insert_entry(NewEntry("default", "qo-entry", "queues.test.double", json.dumps({"n": 20}), ""))
    assert not Execution.objects.filter(pk="qo-entry").exists()
    assert sorted(run_due()) == ["completed", "completed"] and run_due() == []
    assert Execution.objects.get(pk="qo-task").result == 20 and Execution.objects.get(pk="qo-entry").result == 40
    assert steps_run("qo-task") == 1 and steps_run("qo-entry") == 1


@pytest.mark.django_db(transaction=True)  # committed rows: the database file / pg_dump sees them
def test_a_queued_sensitive_input_forgotten_leaves_no_plaintext_and_its_run_never_gets_it(settings, tmp_path):
    """Before: queues.enqueue kept Sensitive fields in clear in queues_entry.input; forget left them there, and
    the run started after the forget received the real value while describe() showed <forgotten>."""
    from journal.privacy import forget, keys

    settings.LOOM_KEYS = [fx.KEY_A]
    settings.LOOM_CONTENT_DIR = str(tmp_path / "content")
    keys.cache.clear()
    secret = "queued-secret-4711@example.org"
    try:
        eid = enqueue("queues.test.seen", {"customer_id": "c-q9", "email": secret}).execution_id
        signup = enqueue("test.privacy.signup", {"customer_id": "c-q9", "email": secret}).execution_id
        forget("c-q9", by="dpo")
        assert secret not in database_bytes()
        assert sorted(run_due()) == ["completed", "completed"]
        header = Execution.objects.get(pk=eid)
        assert header.result["seen"] != secret and secret not in header.result["seen"]  # never given the value
        assert describe(signup)["input"]["email"] != secret
        assert secret not in database_bytes()
    finally:
        keys.cache.clear()


class Counted(BaseModel):
    person: str
    n: Annotated[int, Sensitive(subject="person")]


@flow("queues.test.counted", input_model=Counted)
def counted(ctx, value):
    return value.n


@pytest.mark.django_db
def test_a_queued_start_whose_forgotten_input_no_longer_fits_its_model_fails_without_running(settings, tmp_path):
    """The run reads its input from the log: a marked int forgotten while queued reads as the marker, which
    the flow's model refuses; the execution fails, named, and no step runs (it is never run unleased)."""
    from journal.privacy import forget, keys
    from tests.fixtures import privacy_fixtures as fx

    settings.LOOM_KEYS = [fx.KEY_A]
    settings.LOOM_CONTENT_DIR = str(tmp_path / "content")
    keys.cache.clear()
    try:
        eid = enqueue("queues.test.counted", {"person": "p-77", "n": 5}).execution_id
        forget("p-77", by="dpo")
        assert run_due() == ["failed"]
        header = Execution.objects.get(pk=eid)
        assert header.status == "failed" and "cannot start the flow any more" in header.error
        assert steps_run(eid) == 0
    finally:
        keys.cache.clear()


def database_bytes() -> str:
    """Every byte the test database holds: `pg_dump --data-only` on PostgreSQL, the file (and its WAL) on SQLite."""
    import os
    import subprocess

    s = connection.settings_dict
    if connection.vendor == "postgresql":
        env = {**os.environ, "PGPASSWORD": s["PASSWORD"] or ""}
        dump = subprocess.run(["pg_dump", "--data-only", "-h", s["HOST"] or "127.0.0.1", "-p", str(s["PORT"] or 5432),
                               "-U", s["USER"] or "postgres", s["NAME"]], env=env, capture_output=True, check=True)
        return dump.stdout.decode("utf-8", "replace")
    data = b""
    for suffix in ("", "-wal", "-journal"):
        if os.path.exists(s["NAME"] + suffix):
            with open(s["NAME"] + suffix, "rb") as file:
                data += file.read()
    return data.decode("utf-8", "replace")
