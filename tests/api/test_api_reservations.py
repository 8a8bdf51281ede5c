"""Repeated starts of one execution id, and the migration path of reservations.

Issue #24: a queued start is an execution at once (status queued), so a second start of its id is answered
from the execution (issue #25: 200 to the same starter of the same flow, 404 to a token that may not read
it, as GET answers, else 409; never decided by the input). Reservations (leases.StartReservation) are what
starts queued before that wrote beside their django-q2 task: a delivered old-scheme task runs only the start
its reservation describes, once. Entries and old-scheme tasks wait here until the test delivers them."""

from __future__ import annotations

import json

import pytest
from django.core.checks import run_checks
from django.test import Client
from django_q.models import OrmQ

from journal.flows import Context, flow
from journal.flows.ownership import get_ownership, set_ownership
from journal.models import Event, Execution
from leases.models import StartReservation
from leases.tasks import enqueue_start, prune_reservations, run_start
from queues.models import QueueEntry
from tests.fixtures import api_flows  # noqa: F401  (registers tests.api.gated)
from tests.fixtures.lease_flows import queue_old_scheme_start

pytestmark = pytest.mark.django_db

@flow("tests.api_reservations.echo")
def echo(ctx: Context, value):
    """No input_model: any JSON value, null included."""
    return value


ALICE, BOB, CALC = "alice-token-0123456789abcdef", "bob-token-0123456789abcdef", "calc-token-0123456789abcdef"


@pytest.fixture(autouse=True)
def api_settings(settings):
    settings.LOOM_API_AUTH = True
    settings.LOOM_API_TOKENS = [{"token": ALICE, "name": "alice", "read": "own"},
                                {"token": BOB, "name": "bob", "read": "own"},
                                {"token": CALC, "name": "calc", "flows": ["calc.*"]}]
    installed = get_ownership()
    set_ownership(None)  # deliveries run in this process without lease keepers (the runs are short)
    yield
    set_ownership(installed)


def post(client: Client, token: str, path: str, body: dict):
    return client.post(path, data=json.dumps(body), content_type="application/json",
                       headers={"Authorization": f"Bearer {token}"})


def get(client: Client, token: str, path: str):
    return client.get(path, headers={"Authorization": f"Bearer {token}"})


def deliver_all() -> list[dict]:
    """Run every old-scheme task once, as a django-q2 worker would (each routes its start into the queue),
    empty django-q2's queue, then run every due queue entry as a dispatcher would."""
    from queues import run_due

    for queued in OrmQ.objects.order_by("id"):
        task = queued.task
        run_start(*task["args"], **task["kwargs"])
        queued.delete()
    return [{"status": status} for status in run_due()]


def test_a_second_start_of_a_queued_id_by_another_token_is_404_and_cannot_take_it_over(client):
    """The reviewer's repro: before the fix both got 202 created:true, bob's ran, alice's GET was 404. Issue
    #25: bob, who may not read alice's executions, is answered as GET answers him (404), never 409; alice's
    repeat is hers whatever its input (200, created false, status queued)."""
    path = "/api/flows/calc.add/executions"
    first = post(client, ALICE, path, {"input": {"a": 1, "b": 2}, "execution_id": "X"})
    assert (first.status_code, first.json()["created"]) == (202, True)
    stolen = post(client, BOB, path, {"input": {"a": 100, "b": 200}, "execution_id": "X"})
    assert stolen.status_code == 404, stolen.content
    changed = post(client, ALICE, path, {"input": {"a": 5, "b": 5}, "execution_id": "X"})
    assert (changed.status_code, changed.json()["created"]) == (200, False), changed.content
    again = post(client, ALICE, path, {"input": {"a": 1, "b": 2}, "execution_id": "X"})
    assert again.status_code == 200
    assert again.json() == {"execution_id": "X", "flow": "calc.add", "status": "queued", "result": None,
                            "error": None, "created": False}
    assert QueueEntry.objects.filter(execution_id="X").count() == 1  # only alice's first start was queued
    queued = get(client, ALICE, "/api/executions/X")
    assert queued.status_code == 200
    assert (queued.json()["status"], queued.json()["flow"]) == ("queued", "calc.add")
    assert get(client, BOB, "/api/executions/X").status_code == 404  # bob may not read alice's
    assert [o["status"] for o in deliver_all()] == ["completed"]
    done = get(client, ALICE, "/api/executions/X").json()
    assert (done["status"], done["result"]) == ("completed", 3)
    assert not StartReservation.objects.exists()
    assert post(client, BOB, path, {"input": {"a": 100, "b": 200}, "execution_id": "X"}).status_code == 404


def test_a_delivered_start_that_is_not_the_reserved_one_does_nothing():
    """A task whose flow, input or starter differ from the id's reservation (one queued by other means)
    is refused by run_start: the reserved start is the one that runs."""
    queue_old_scheme_start("calc.add", {"a": 1, "b": 2}, "R", {"started_by": "alice"})
    foreign = run_start("calc.add", {"a": 100, "b": 200}, "R", {"started_by": "bob"})
    assert (foreign["status"], foreign["duplicate"]) == ("refused", True)
    assert not Event.objects.filter(stream_id="R").exists()
    assert [o["status"] for o in deliver_all()] == ["completed"]
    assert Event.objects.filter(stream_id="R", type="EXECUTION_COMPLETED").exists()


def test_enqueue_start_repeats_are_idempotent_and_a_different_input_is_refused():
    from journal.flows import ExecutionExists

    assert enqueue_start("calc.add", {"a": 1, "b": 2}, execution_id="I") == "I"
    assert enqueue_start("calc.add", {"a": 1, "b": 2}, execution_id="I") == "I"
    with pytest.raises(ExecutionExists):
        enqueue_start("calc.add", {"a": 9, "b": 2}, execution_id="I")
    assert QueueEntry.objects.filter(execution_id="I").count() == 1 and not OrmQ.objects.exists()
    deliver_all()
    assert enqueue_start("calc.add", {"a": 1, "b": 2}, execution_id="I") == "I"  # begun: nothing more queued
    assert QueueEntry.objects.filter(execution_id="I").count() == 1


def test_reservations_of_begun_executions_are_pruned_and_are_no_orphans():
    """A worker that died between the execution's first write and deleting the reservation leaves it;
    the backstop's prune removes it. A reservation has no execution header, so recovery never sees it."""
    queue_old_scheme_start("calc.add", {"a": 1, "b": 2}, "P1")  # queued before issue #24
    queue_old_scheme_start("calc.add", {"a": 1, "b": 2}, "P2")
    assert not Execution.objects.filter(pk__in=["P1", "P2"]).exists()
    row = StartReservation.objects.get(pk="P1")
    deliver_all()
    StartReservation.objects.bulk_create([row])  # as if the delete had not happened
    queue_old_scheme_start("calc.add", {"a": 1, "b": 2}, "P3")
    assert prune_reservations() == 1
    assert list(StartReservation.objects.values_list("pk", flat=True)) == ["P3"]


def test_a_token_scoped_to_some_flows_reads_only_executions_of_those_flows(client):
    """Before: {"flows": ["calc.*"]} defaulted to read "all" and read every execution."""
    assert post(client, ALICE, "/api/flows/tests.api.gated/executions",
                {"input": {"gate": "/nonexistent"}, "execution_id": "G"}).status_code == 202
    assert get(client, CALC, "/api/executions/G").status_code == 404
    assert post(client, CALC, "/api/flows/calc.add/executions", {"input": {"a": 1, "b": 1},
                                                                  "execution_id": "C"}).status_code == 202
    assert get(client, CALC, "/api/executions/C").status_code == 200  # issue #24: an execution, queued


def test_two_token_entries_with_one_name_are_a_system_check_error(settings):
    settings.LOOM_API_TOKENS = [{"token": ALICE, "name": "ci", "read": "own"}, {"token": BOB, "name": "ci"}]
    found = {m.id: m.msg for m in run_checks() if m.id == "loom.E201"}
    assert "more than once" in found.get("loom.E201", ""), found


def test_a_durable_start_with_null_input_of_a_flow_without_input_model_completes(client):
    """Reported: 202, then an IntegrityError (NOT NULL journal_execution.input) in the worker."""
    path = "/api/flows/tests.api_reservations.echo/executions"
    response = post(client, ALICE, path, {"input": None, "execution_id": "N"})
    assert response.status_code == 202, response.content
    assert [o["status"] for o in deliver_all()] == ["completed"]
    done = get(client, ALICE, "/api/executions/N").json()
    assert (done["status"], done["input"], done["result"]) == ("completed", None, None)


def test_a_reservation_keeps_no_bare_hash_of_the_input_and_survives_a_key_rotation(settings):
    """The reservation's input hash is keyed by SECRET_KEY: the bare SHA-256 of an input holding an e-mail
    address is not stored (it is found by hashing candidates). A start reserved before SECRET_KEY rotated
    (the old key in SECRET_KEY_FALLBACKS) is still the same request when repeated, and still runs when its
    task is delivered; one reserved before the hash was keyed (a bare SHA-256 row) runs too."""
    import hashlib

    from leases.tasks import input_hash

    value = {"email": "ann@example.org"}
    bare = hashlib.sha256(json.dumps(value, separators=(",", ":")).encode()).hexdigest()
    queue_old_scheme_start("tests.api_reservations.echo", value, "K")  # queued before issue #24
    row = StartReservation.objects.get(execution_id="K")
    assert row.input_hash != bare and row.input_hash == input_hash(value)
    old = settings.SECRET_KEY
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = "rotated-" + "r" * 50, [old]
    assert input_hash(value) != row.input_hash
    assert OrmQ.objects.count() == 1
    StartReservation.objects.create(execution_id="L", flow="tests.api_reservations.echo", input_hash=bare)
    legacy = run_start("tests.api_reservations.echo", value, "L", None)
    assert legacy["status"] == "queued"  # routed into the queue
    assert [o["status"] for o in deliver_all()] == ["completed", "completed"]
    assert Execution.objects.filter(id__in=["K", "L"], status="completed").count() == 2
