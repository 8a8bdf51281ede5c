"""Ids stored before the id alphabet existed stay readable and operable; new ones cannot be created;
the admin answers "does not exist" (never a 500) for ids the database cannot hold.

An id like `order\\u200b42` (a zero-width space) was accepted before journal/ids.py: such executions
must still be shown, resumed, cancelled, retried and recovered, and aggregates still loaded and
written. "Stored before" is reproduced by writing with the creation check switched to the storable
rule, as the old code did; every later call runs the code as it is.
"""

from __future__ import annotations

import pytest
from django.core.checks import run_checks

from journal import envelopes
from journal.aggregates import do, load
from journal.envelopes import Envelope
from journal.exceptions import InvalidStream
from journal.flows import NotResumable, cancel, describe, resume, start
from journal.flows import runtime as flows_runtime
from journal.flows.errors import InvalidInput
from journal.flows.runtime import retry
from journal.ids import check_stored_id
from journal.models import Event, Execution, Fence
from tests.admin.test_admin_executions import _flows, crashed, failed, run_queued  # noqa: F401  (autouse fixture)
from tests.fixtures import admin_flows as af
from tests.journal.test_inputs_boundary import Bump, bump, tally  # noqa: F401

pytestmark = pytest.mark.django_db

OLD = ["order\u200b42", "\ufeffbom-1", "bidi\u202eevil", "c1\x85x", "../x", "a b"]


@pytest.fixture
def before_the_alphabet(monkeypatch):
    """Creation as the old code did it: any storable id."""
    def lenient(stream_id):
        return check_stored_id(stream_id, "stream id")

    for module in (envelopes, flows_runtime):
        monkeypatch.setattr(module, "check_new_stream_id", lenient, raising=False)
        monkeypatch.setattr(module, "check_stream_id", lenient, raising=False)  # (the name before the split)
    return monkeypatch


@pytest.mark.parametrize("old", OLD, ids=ascii)
def test_an_execution_stored_before_the_alphabet_can_be_shown_resumed_and_cancelled(old, before_the_alphabet):
    crashed(old)
    crashed(old + "-c")
    before_the_alphabet.undo()
    with pytest.raises(InvalidInput):  # a new one like it cannot be created
        start("admin.crash_once", {}, execution_id=old + "-new")
    assert describe(old)["status"] == "running"
    assert resume(old).status == "completed"
    assert cancel(old + "-c").status == "cancelled"
    assert Execution.objects.get(pk=old).status == "completed"


@pytest.mark.parametrize("old", OLD[:2], ids=ascii)
def test_an_execution_stored_before_the_alphabet_can_be_retried_and_handed_over(old, before_the_alphabet):
    failed(old)
    crashed(old + "-h")
    before_the_alphabet.undo()
    assert retry(old, handoff=True).status == "running"
    from journal.flows import hand_over

    assert hand_over(old + "-h") == 1
    assert sorted(o["status"] for o in run_queued()) == ["completed", "completed"]
    with pytest.raises(NotResumable):
        retry(old)  # completed now: refused as any completed execution is, not as an invalid id


def test_appends_to_a_stream_stored_before_the_alphabet_need_a_guard(before_the_alphabet):
    old = "legacy\u200bstream"
    Event.objects.append(old, Envelope("Opened"))
    token, _ = Event.objects.open_stream(old + "-fenced", Envelope("Opened"))
    before_the_alphabet.undo()
    assert Event.objects.append(old, Envelope("More"), expected_seq=0).last_seq == 1
    assert Event.objects.append(old + "-fenced", Envelope("More"), fence_token=token).last_seq == 1
    assert Fence.objects.advance(old + "-fenced") == token + 1
    with pytest.raises(InvalidStream):  # unguarded, it could create a stream: the alphabet applies
        Event.objects.append(old, Envelope("More"))
    assert [e.type for e in Event.objects.read(old)] == ["Opened", "More"]
    with pytest.raises(InvalidStream):
        Event.objects.open_stream("new\u200bstream", Envelope("Opened"))
    assert Event.objects.tip("new\u200bstream") == -1


def test_an_aggregate_stored_before_the_alphabet_loads_and_takes_commands(before_the_alphabet):
    old = "t\u200b1"
    do(bump, old, {"by": 2})
    before_the_alphabet.undo()
    assert load(tally, old).state.n == 2
    do(bump, old, {"by": 3})
    assert load(tally, old).state.n == 5
    with pytest.raises(InvalidStream):
        do(bump, "t\u200b2", {"by": 1})


def test_the_database_check_lists_stored_ids_outside_the_alphabet(before_the_alphabet):
    Event.objects.append("fine-1", Envelope("E"))
    assert [m.id for m in run_checks(tags=["database"], databases=["default"]) if m.id == "loom.W020"] == []
    Event.objects.append("order\u200b42", Envelope("E"))
    before_the_alphabet.undo()
    found = [m for m in run_checks(tags=["database"], databases=["default"]) if m.id == "loom.W020"]
    assert len(found) == 1 and "order\\u200b42" in found[0].msg and "fine-1" not in found[0].msg
    assert not [m for m in run_checks() if m.id == "loom.W020"]  # no database tag: not run


# -- the admin: ids it cannot find are "does not exist", never a 500 ------------------------------------
@pytest.mark.parametrize("url", [
    "/admin/journal/execution/a%20b/change/",
    "/admin/journal/execution/..%2Fx/change/",
    "/admin/journal/execution/a%00b/change/",
    "/admin/journal/execution/a%ED%A0%80b/change/",
    "/admin/journal/execution/a%00b/resume/",
    "/admin/journal/execution/a%00b/cancel/",
    "/admin/journal/execution/a%00b/retry/",
    "/admin/leases/recoveryview/a%00b/change/",
    "/admin/leases/recoveryview/a%20b/change/",
])
def test_admin_pages_of_ids_that_do_not_exist_are_not_server_errors(admin_client, url):
    response = admin_client.get(url)
    assert response.status_code in (302, 404), (url, response.status_code)
    response = admin_client.post(url)
    # A POST to a read-only page may also be refused outright (Django 5.2 checks the permission first).
    assert response.status_code in (302, 403, 404), (url, response.status_code)


def test_the_admin_page_of_an_execution_stored_before_the_alphabet_shows_it(admin_client, before_the_alphabet):
    from journal.admin import execution_url

    old = "order\u200b42"
    af.CRASH = True
    with pytest.raises(af.Crash):
        start("admin.crash_once", {}, execution_id=old)
    af.CRASH = False
    before_the_alphabet.undo()
    page = admin_client.get(execution_url(old))
    assert page.status_code == 200 and page.context["execution_view"]["status"] == "running"


@pytest.mark.django_db(transaction=True)
def test_migrate_on_an_empty_database_runs_the_database_check_without_tables(child_env, tmp_path):
    """`migrate` runs the `database` checks before it creates the tables: the id check skips them."""
    from tests.conftest import run_child

    env = {**child_env, "DATABASE_URL": f"sqlite:///{tmp_path / 'empty.sqlite3'}"}
    run_child("from django.core.management import call_command; call_command('migrate', verbosity=0)", env,
              timeout=300)
