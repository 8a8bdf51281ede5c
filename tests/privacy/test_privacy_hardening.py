"""Personal data, the reviewer's findings (docs/privacy.md): the broker's rows, declared aggregates, the admin's
state, reserved keys, failure text, the content directory, roles and key binding.

Every test runs on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import re

import pytest
from django_q.models import OrmQ, Task
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from journal.envelopes import Envelope
from journal.exceptions import InvalidPayload, TamperedCiphertext
from journal.flows import describe
from journal.models import Event, Execution
from journal.privacy import keys
from journal.privacy.codec import RESERVED
from leases.tasks import run_start
from tests.fixtures import privacy_fixtures as fx

pytestmark = pytest.mark.django_db

TOKEN = "tok-hardening-0123456789"


@pytest.fixture
def sealed(settings, tmp_path):
    """Master key A, an empty key cache and a content store of this test's own."""
    settings.LOOM_KEYS = [fx.KEY_A]
    settings.LOOM_CONTENT_DIR = str(tmp_path / "content")
    keys.cache.clear()
    yield settings
    keys.cache.clear()


def broker_rows() -> str:
    """What django-q2 keeps of its tasks, decoded (its rows are pickled and signed, not encrypted): the queue
    rows' packages and the task rows' args, kwargs and results."""
    from django_q.signing import SignedPackage

    found = [repr(SignedPackage.loads(row.payload)) for row in OrmQ.objects.all()]
    found += [repr((t.args, t.kwargs, t.result)) for t in Task.objects.all()]
    return "\n".join(found)


def api_start(client, execution_id: str, email: str):
    return client.post("/api/flows/test.privacy.signup/executions", content_type="application/json",
                       data=json.dumps({"input": {"customer_id": "c-q", "email": email}, "execution_id": execution_id}),
                       headers={"Authorization": f"Bearer {TOKEN}"})


# -- P1: the broker ----------------------------------------------------------------------------------------------


def test_a_queued_start_puts_no_marked_value_in_the_brokers_rows_and_runs(sealed, client, monkeypatch):
    """The API's start queues the input sealed (issue #24: the queued execution's EXECUTION_STARTED, sealed by
    the writer, with its header and entry): no django-q2 row, and neither the entry nor the header holds the
    value; the worker's run reads it back from the log, and the system reads it back."""
    from queues import run_due
    from queues.models import QueueEntry

    sealed.LOOM_API_AUTH = True
    sealed.LOOM_API_TOKENS = [{"token": TOKEN, "name": "starter"}]
    assert api_start(client, "pq-1", "queued@example.org").status_code == 202
    assert not OrmQ.objects.exists() and "queued@example.org" not in broker_rows()
    entry = QueueEntry.objects.get(execution_id="pq-1")
    assert "queued@example.org" not in entry.input + entry.meta
    assert "queued@example.org" not in json.dumps(Execution.objects.get(pk="pq-1").input)
    assert run_due() == ["completed"]
    assert describe("pq-1")["input"]["email"] == "queued@example.org"
    started = Event.objects.filter(stream_id="pq-1", seq=0).values_list("payload", flat=True).get()
    started = started if isinstance(started, dict) else json.loads(started)
    assert started["$sealed"] == [[["input", "email"], "c-q", 2]]  # sealed once, bound to pq-1
    assert "queued@example.org" not in json.dumps(started)


# -- P2: an aggregate whose event type is marked by declare() ------------------------------------------------------


def test_a_state_folding_a_declared_type_is_not_snapshotted_nor_cached_and_forget_reaches_its_loads(sealed):
    """declare() marks the event type after the state was built (snapshot_every=1): no snapshot row, no cached
    state; after forget, load() and replay() show the marker."""
    from journal.aggregates import do, load, replay
    from journal.models import Snapshot
    from journal.privacy import FORGOTTEN, forget

    do(fx.add_contact, "c-d", {"email": "declared@example.org"}, actor="c-d")
    do(fx.add_contact, "c-d", {"email": "declared2@example.org"}, actor="c-d")
    assert load(fx.contacts, "c-d").state.email == "declared2@example.org"
    assert not Snapshot.objects.filter(stream_id="PrivacyContact-c-d").exists()
    assert "declared2@example.org" not in json.dumps(list(Event.objects.filter(
        stream_id="PrivacyContact-c-d").values_list("payload", flat=True)), default=str)
    forget("c-d", by="dpo")
    assert load(fx.contacts, "c-d").state.email == FORGOTTEN
    assert replay(fx.contacts, "c-d").state.email == FORGOTTEN


# -- P8: the admin's current state ---------------------------------------------------------------------------------


def test_the_admin_state_of_an_unmarked_state_folding_marked_events_is_withheld_from_staff_without_disclosure(
        sealed, client, django_user_model):
    """The state model has no marks, its event type has: a staff user without disclosure sees neither the events'
    nor the state's value; with journal.disclose_personal_data, both."""
    from django.contrib.auth.models import Permission

    from journal.aggregates import do
    from journal.privacy import WITHHELD

    do(fx.add_contact, "c-a", {"email": "folded@example.org"}, actor="c-a")
    staff = django_user_model.objects.create_user("viewer", password="pw-long-enough-1", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_aggregatestream"))
    client.force_login(staff)
    response = client.get("/admin/journal/aggregatestream/PrivacyContact/c-a/")
    assert response.status_code == 200
    page = response.content.decode()
    assert "folded@example.org" not in page
    assert f'"email": "{WITHHELD}"'.replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;") in page
    staff.user_permissions.add(Permission.objects.get(codename="disclose_personal_data"))
    client.force_login(django_user_model.objects.get(pk=staff.pk))
    assert client.get("/admin/journal/aggregatestream/PrivacyContact/c-a/").content.decode().count(
        "folded@example.org") == 2  # the event and the state


# -- P3: reserved keys ---------------------------------------------------------------------------------------------

json_values = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=10),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                      max_size=3), max_leaves=6)


@hsettings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(sorted(RESERVED)), value=json_values,
       others=st.dictionaries(st.text(max_size=8).filter(lambda k: k not in RESERVED), json_values, max_size=3),
       marked=st.booleans())
def test_a_payload_with_a_reserved_key_is_refused_naming_it_and_nothing_is_written(sealed, key, value, others,
                                                                                     marked):
    """Unmarked (plain JSON stored as given) or marked type: a top-level $sealed/$blobs/$content/$size is
    InvalidPayload naming the key, and the stream stays empty (a reader would take it for sealed data)."""
    stream = "reserved-1"
    payload = {**others, key: value}
    if marked:
        payload.update(customer_id="c-r", email="r@example.org")
    with pytest.raises(InvalidPayload, match=f"reserved key .*{re.escape(key)}"):
        Event.objects.append(stream, [Envelope("PrivacyOrder" if marked else "PlainWebhook", payload)])
    assert Event.objects.read(stream) == []


@pytest.mark.parametrize("header", [{"$sealed": "yes"}, {"$sealed": None}, {"$sealed": [["email", "c-1"]]},
                                    {"$blobs": "x"}, {"$blobs": [["doc"]], "doc": "../../etc/passwd"},
                                    {"$content": "../secret"}, {"$content": 7, "$size": 1}])
def test_a_stored_payload_with_a_malformed_header_reads_as_a_named_error(sealed, header):
    """A row changed in the table (or written as plain data before reserved keys were refused) is named on
    read: TamperedCiphertext with the stream and seq, never a bare ValueError or a path of the storage."""
    Event.objects.append("malformed-1", [Envelope("PlainWebhook", {"doc": "d", "email": "e"})])
    Event.objects.filter(stream_id="malformed-1").update(payload={"doc": "d", "email": "e", **header})
    with pytest.raises(TamperedCiphertext, match=r"malformed-1#0: the payload's \$(sealed|blobs|content)"):
        Event.objects.read("malformed-1")


@pytest.mark.parametrize("change", [{"$sealed": [[["email"], 7]]}, {"$sealed": [[["email"], "c-h"], [[], "c-h"]]},
                                    {"$size": 3}])
def test_a_malformed_header_after_well_formed_ones_of_the_same_read_is_named(sealed, change):
    """Events of a read mostly share one header, checked once: a later one that differs (a subject that is not
    a string, an empty path, a second reference) is still checked, and named with its own seq."""
    Event.objects.append("malformed-2", [Envelope("PrivacyOrder", {"customer_id": "c-h", "email": f"{n}@x"})
                                         for n in range(3)])
    stored = Event.objects.get(stream_id="malformed-2", seq=2).payload
    Event.objects.filter(stream_id="malformed-2", seq=2).update(payload={**stored, **change})
    with pytest.raises(TamperedCiphertext, match=r"malformed-2#2: the payload's \$(sealed|size)"):
        Event.objects.read("malformed-2")


# -- P4: the content directory -------------------------------------------------------------------------------------


def test_the_default_content_directory_is_absolute_and_a_relative_one_is_a_warning(settings):
    """Unset, LOOM_CONTENT_DIR is <BASE_DIR>/var/loom-content: every process (web, worker, cron), whatever its
    working directory, uses the same store. A relative one is loom.W032."""
    import os
    from pathlib import Path

    from django.core.checks import run_checks

    from journal.privacy import content

    settings.LOOM_CONTENT_DIR = ""
    location = content.store().storage.base_location
    assert os.path.isabs(location)
    assert Path(location) == Path(settings.BASE_DIR) / "var" / "loom-content"
    assert "loom.W032" not in {m.id for m in run_checks()}
    settings.LOOM_CONTENT_DIR = "var/elsewhere"
    assert "loom.W032" in {m.id for m in run_checks()}


# -- P5: failure text ----------------------------------------------------------------------------------------------


def test_the_failure_text_of_a_flow_with_marked_input_holds_no_marked_value(sealed):
    """A step's error echoing the input and a pydantic error carrying it as input_value: the events, the header
    and describe() keep the error's type and message, not the value."""
    from django.db import connection

    from journal.flows import start

    outcome = start("test.privacy.fails", {"customer_id": "c-f", "email": "failing@example.org"},
                    execution_id="pf-1")
    assert outcome.status == "failed"
    assert outcome.error.startswith("ValidationError") and "age" in outcome.error
    info = describe("pf-1")
    assert info["error"] == outcome.error and "could not mail" in json.dumps(info, default=str)
    with connection.cursor() as cursor:
        found = []
        for table in connection.introspection.table_names():
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")
            found.extend(repr(row) for row in cursor.fetchall())
    assert "failing@example.org" not in "\n".join(found)
    assert info["input"]["email"] == "failing@example.org"  # the system still reads the sealed input
    shown = json.dumps([info["error"], info["steps"], [e for e in info["events"] if "FAILED" in e["type"]]],
                       default=str)
    assert "failing@example.org" not in shown and "could not mail <redacted>" in shown


def test_the_traceback_of_a_validation_error_cut_by_pydantic_holds_no_fragment_of_a_marked_value(
        sealed, client, django_user_model):
    """pydantic shows a long input value cut in the middle (`'O\'Brien, alice.longsurna...yyyy'`), which the
    withholding of whole marked values misses: the step's and the flow's tracebacks describe the error without its
    input values. No 10-character fragment of the email is in the events, describe() or the admin page (of a
    staff user without disclose_personal_data)."""
    from django.contrib.auth.models import Permission

    from journal.flows import start

    email = "alice.longsurname-privacy@example.org"
    outcome = start("test.privacy.fails_long", {"customer_id": "c-l", "email": email}, execution_id="pf-long")
    assert outcome.status == "failed" and outcome.error.startswith("ValidationError")
    info = describe("pf-long")
    failures = [e for e in info["events"] if e["type"] in ("STEP_FAILED", "EXECUTION_FAILED")]
    traces = [e["payload"].get("traceback", "") for e in failures]
    assert {e["type"] for e in failures} == {"STEP_FAILED", "EXECUTION_FAILED"}
    staff = django_user_model.objects.create_user("viewer", password="pw-long-enough-1", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_execution"))
    client.force_login(staff)
    page = client.get("/admin/journal/execution/pf-long/change/").content.decode()
    stored = "\n".join(repr(row) for row in Event.objects.filter(stream_id="pf-long").values_list("payload"))
    # describe() reads the sealed input back (the system may): everything but it and its EXECUTION_STARTED
    shown = json.dumps([{k: v for k, v in info.items() if k not in ("input", "events")},
                        [e for e in info["events"] if e["type"] != "EXECUTION_STARTED"]], default=str)
    fragments = [email[i:i + 10] for i in range(len(email) - 9)]
    for where, text in (("events", stored), ("describe", shown), ("admin", page)):
        assert not [f for f in fragments if f in text], where
    # the error described as its error text is: where and what, no input value
    assert all("ValidationError" in t and "age: Input should be a valid integer" in t for t in traces), traces
    assert "age: Input should be a valid integer" in page
    assert info["input"]["email"] == email  # the system still reads the sealed input


# -- P6: roles and owners of admin users ---------------------------------------------------------------------------


def test_an_admin_user_gets_roles_only_from_the_permission_or_a_mapped_group_and_owns_no_subject(
        sealed, client, django_user_model):
    """A group merely named like a role ("privacy", "support") grants nothing, nor does a username equal to a
    subject id; LOOM_DISCLOSE_GROUPS maps a group to a role explicitly."""
    from django.contrib.auth.models import Group, Permission

    from journal.flows import start
    from journal.privacy import WITHHELD, reader_for_user

    start("test.privacy.signup", {"customer_id": "c-own", "email": "own@example.org"}, execution_id="pr-1")
    staff = django_user_model.objects.create_user("c-own", password="pw-long-enough-1", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_execution"))
    for name in ("privacy", "support", "Support desk"):
        staff.groups.add(Group.objects.create(name=name))
    client.force_login(staff)
    page = client.get("/admin/journal/execution/pr-1/change/").content.decode()
    assert "own@example.org" not in page and "&lt;redacted&gt;" in page
    assert reader_for_user(staff).roles == frozenset()
    sealed.LOOM_DISCLOSE_GROUPS = ["Support desk:support"]
    reader = reader_for_user(staff)
    assert reader.roles == frozenset({"support"})
    from journal.aggregates import do

    do(fx.register, "c-9", {"email": "sup@example.org"}, actor="c-9")  # Registered.email discloses "support"
    assert Event.objects.read("PrivacyCustomer-c-9", reader=reader)[0].payload["email"] == "sup@example.org"
    assert describe("pr-1", reader)["input"]["email"] == WITHHELD  # Signup.email does not
    sealed.LOOM_DISCLOSE_GROUPS = ["no colon here"]
    from django.core.checks import run_checks

    assert "loom.E001" in {m.id for m in run_checks()}


# -- P7: a wrapped data key is bound to its subject ----------------------------------------------------------------


def test_a_wrapped_data_key_copied_onto_another_subject_does_not_unwrap_and_rotation_keeps_keys_bound(sealed):
    """Someone who can write journal_datakey copies subject A's wrapped key onto B's row: B's key is then not A's
    (MasterKeyError on use, never A's key); a rotation rewraps every key still bound to its own subject."""
    from django.core.checks import run_checks

    from journal.exceptions import MasterKeyError
    from journal.privacy import keys as keys_module
    from journal.store import store_for

    store = store_for()
    Event.objects.append("bind-a", [Envelope("PrivacyOrder", {"customer_id": "bind-a", "email": "a@example.org"})])
    Event.objects.append("bind-b", [Envelope("PrivacyOrder", {"customer_id": "bind-b", "email": "b@example.org"})])
    rows = store.data_keys(["bind-a", "bind-b"])
    assert {r[0] for r in rows.values()} == {"ka"}
    # the copy, as an attacker with write access to the key table would make it (here through the store)
    assert store.rewrap_data_key("bind-c", "", "ka", "") == 0
    Event.objects.append("bind-c", [Envelope("PrivacyOrder", {"customer_id": "bind-c", "email": "c@example.org"})])
    wrapped_c = store.data_keys(["bind-c"])["bind-c"][1]
    assert store.rewrap_data_key("bind-c", wrapped_c, "ka", rows["bind-a"][1]) == 1
    keys_module.cache.clear()
    with pytest.raises(MasterKeyError):  # before: A's key, and B's new data sealed with it
        Event.objects.append("bind-c", [Envelope("PrivacyOrder", {"customer_id": "bind-c", "email": "c2@x.org"})])
    with pytest.raises(MasterKeyError):
        Event.objects.read("bind-c")
    store.delete_privacy_rows("bind-c")
    sealed.LOOM_KEYS = [fx.KEY_B, fx.KEY_A]
    keys_module.cache.clear()
    assert keys_module.rotate(store) >= 2
    sealed.LOOM_KEYS = [fx.KEY_B]
    keys_module.cache.clear()
    assert Event.objects.read("bind-a")[0].payload["email"] == "a@example.org"
    assert Event.objects.read("bind-b")[0].payload["email"] == "b@example.org"
    assert not [m for m in run_checks() if m.id == "loom.E031"]


def test_a_queued_start_whose_subject_is_forgotten_before_it_runs_starts_nothing_and_frees_its_id(sealed):
    from journal.models import Execution
    from journal.privacy import forget
    from leases.models import StartReservation
    from tests.fixtures.lease_flows import queue_old_scheme_start

    # A start queued before issue #24 (a django-q2 task, its input sealed), delivered after the forget.
    queue_old_scheme_start("test.privacy.signup", {"customer_id": "c-gone", "email": "gone@example.org"}, "pq-gone")
    forget("c-gone", by="dpo")
    queued = OrmQ.objects.get().task
    outcome = run_start(*queued["args"], **queued["kwargs"])
    assert (outcome["status"], outcome["duplicate"]) == ("refused", False)
    assert not StartReservation.objects.filter(execution_id="pq-gone").exists()
    assert not Execution.objects.filter(pk="pq-gone").exists()
