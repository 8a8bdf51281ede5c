"""Personal data in the log (docs/privacy.md): sealed fields, forget, disclosure, keys, content store.

Every test runs on SQLite and PostgreSQL; the concurrent forget-vs-append race is PostgreSQL only.
"""

from __future__ import annotations

import base64
import json
import threading

import pytest
from django.core.checks import run_checks
from django.db import connection, connections
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from journal.aggregates import do, load, replay
from journal.envelopes import AppendItem, Envelope
from journal.exceptions import ForgottenData, InvalidPayload, MasterKeyError, TamperedCiphertext
from journal.flows import describe, start
from journal.models import Event
from journal.privacy import AUDIT_STREAM, FORGOTTEN, WITHHELD, Reader, forget, keys
from journal.privacy import content as content_store
from journal.store import store_for
from tests.fixtures import flows_fixtures  # noqa: F401  (flows_fixtures: test.add)
from tests.fixtures import privacy_fixtures as fx

pytestmark = pytest.mark.django_db

NONCE_END = 12  # a sealed field's base64 holds the 12-byte nonce, then the ciphertext and its tag


@pytest.fixture
def sealed(settings, tmp_path):
    """Master key A, an empty key cache and a content store of this test's own."""
    settings.LOOM_KEYS = [fx.KEY_A]
    settings.LOOM_CONTENT_DIR = str(tmp_path / "content")
    keys.cache.clear()
    yield settings
    keys.cache.clear()


def raw_rows() -> str:
    """Every row of every table of the database, as text: what an attacker with the database sees."""
    found = []
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names():
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")
            found.extend(repr(row) for row in cursor.fetchall())
    return "\n".join(found)


def raw_payloads(stream_id: str) -> list:
    return list(Event.objects.filter(stream_id=stream_id).order_by("seq").values_list("payload", flat=True))


# -- sealing ---------------------------------------------------------------------------------------------


def test_a_sealed_value_is_in_no_table_in_clear_and_reads_back_for_the_system(sealed):
    """Aggregate event, flow input, step result and a plain envelope: none of the values is stored in
    clear anywhere (raw rows of every table), and every read path of the system sees them."""
    do(fx.register, "c-1", {"email": "ann@example.org"}, actor="c-1")
    Event.objects.append("orders-1", [Envelope("PrivacyOrder", {"customer_id": "c-1", "email": "bob@example.org",
                                                               "address": {"street": "1 Secret Lane"}, "n": 2})])
    start("test.privacy.signup", {"customer_id": "c-1", "email": "cid@example.org"}, execution_id="px-1")
    text = raw_rows()
    for plain in ("ann@example.org", "bob@example.org", "1 Secret Lane", "cid@example.org"):
        assert plain not in text
    assert "c-1" in text  # the subject id is stored in clear (documented)
    assert load(fx.customers, "c-1").state.email == "ann@example.org"
    order = Event.objects.read("orders-1")[0].payload
    assert order == {"customer_id": "c-1", "email": "bob@example.org", "address": {"street": "1 Secret Lane"}, "n": 2}
    info = describe("px-1")
    assert info["input"]["email"] == "cid@example.org"
    assert info["steps"][0]["result"]["text"] == "hi cid@example.org"


def test_an_unmarked_type_is_written_as_it_is(sealed):
    """No marked field: the row holds the payload as given, no header, no key row."""
    Event.objects.append("plain-1", [Envelope("Plain", {"email": "x@example.org"})])
    assert raw_payloads("plain-1") == [{"email": "x@example.org"}]
    assert store_for(Event.objects.db).data_keys(["x@example.org"]) == {}


def test_a_sensitive_field_without_its_subject_is_refused_and_nothing_is_written(sealed):
    with pytest.raises(InvalidPayload, match="customer_id"):
        Event.objects.append("orders-2", [Envelope("PrivacyOrder", {"email": "e@example.org"})])
    with pytest.raises(InvalidPayload, match="reserved"):
        Event.objects.append("orders-2", [Envelope("PrivacyOrder", {"customer_id": "c", "$sealed": []})])
    assert Event.objects.read("orders-2") == []


def test_one_statement_looks_up_the_keys_of_a_whole_read(sealed, django_assert_num_queries):
    """Events of many subjects: their keys are looked up once per read, never per event; on PostgreSQL in
    the read's own statement, on SQLite in one statement more."""
    items = [AppendItem(f"many-{i}", tuple(Envelope("PrivacyOrder", {"customer_id": f"s{i}", "email": f"{i}@x",
                                                                    "n": n}) for n in range(10)))
             for i in range(10)]
    Event.objects.append_batch(items)
    found = store_for(Event.objects.db).read_after([(f"many-{i}", -1) for i in range(10)], 100)
    assert [e.payload["email"] for e in found[("many-3", -1)]] == ["3@x"] * 10
    mixed = [Envelope("PrivacyOrder", {"customer_id": f"m{n}", "email": f"m{n}@x"}) for n in range(10)]
    Event.objects.append("mixed-1", [*mixed, Envelope("Plain", {"n": 1})])
    with django_assert_num_queries(1 if connection.vendor == "postgresql" else 2):
        events = Event.objects.read("mixed-1")
    assert [e.payload.get("email") for e in events] == [f"m{n}@x" for n in range(10)] + [None]


def test_a_read_whose_events_name_two_subjects_each_shows_both_and_forget_reaches_only_one(
        sealed, django_assert_num_queries):
    """PostgreSQL's read brings the key of each event's first subject; the second subjects' keys are looked up
    in one statement more for the whole read (never per event), on SQLite with the first ones."""
    Event.objects.append("trades-1", [Envelope("PrivacyTrade", {"buyer": f"b{n}", "seller": "s1", "n": n,
                                                               "buyer_email": f"b{n}@x", "seller_email": "s1@x"})
                                      for n in range(5)])
    with django_assert_num_queries(2):
        events = Event.objects.read("trades-1")
    assert [(e.payload["buyer_email"], e.payload["seller_email"]) for e in events] == [(f"b{n}@x", "s1@x")
                                                                                       for n in range(5)]
    forget("s1", by="test")
    events = Event.objects.read("trades-1")
    assert [(e.payload["buyer_email"], e.payload["seller_email"]) for e in events] == [(f"b{n}@x", FORGOTTEN)
                                                                                       for n in range(5)]


# -- forget -----------------------------------------------------------------------------------------------


def test_after_forget_every_read_path_shows_the_marker_and_the_log_is_not_rewritten(sealed, admin_client):
    do(fx.register, "c-2", {"email": "gone@example.org"}, actor="c-2")
    do(fx.register, "c-3", {"email": "kept@example.org"}, actor="c-3")
    start("test.privacy.signup", {"customer_id": "c-2", "email": "gone@example.org"}, execution_id="px-2")
    before = raw_payloads("PrivacyCustomer-c-2") + raw_payloads("px-2")
    forget("c-2", by="dpo@example.org")
    assert raw_payloads("PrivacyCustomer-c-2") + raw_payloads("px-2") == before  # nothing in journal_event rewritten
    assert load(fx.customers, "c-2").state.email == FORGOTTEN
    assert replay(fx.customers, "c-2").state.email == FORGOTTEN
    assert load(fx.customers, "c-3").state.email == "kept@example.org"
    info = describe("px-2")
    assert info["input"]["email"] == FORGOTTEN and info["steps"][0]["result"]["text"] == FORGOTTEN
    assert "gone@example.org" not in json.dumps(info, default=str)
    page = admin_client.get(f"/admin/journal/execution/{'px-2'}/change/").content.decode()
    assert "gone@example.org" not in page and FORGOTTEN.replace("<", "&lt;").replace(">", "&gt;") in page
    audit = Event.objects.read(AUDIT_STREAM)
    assert [(e.type, e.payload) for e in audit] == [("SubjectForgotten", {"subject": "c-2", "by": "dpo@example.org"})]


def test_forget_writes_a_constant_number_of_rows(sealed, django_assert_max_num_queries):
    """Forgetting a subject with 50 events writes its key row and the audit event, never per event."""
    Event.objects.append("big-1", [Envelope("PrivacyOrder", {"customer_id": "c-4", "email": "e"}) for _ in range(50)])
    with django_assert_max_num_queries(12) as queries:
        forget("c-4", by="ops")
    writes = [q["sql"] for q in queries.captured_queries if q["sql"].lstrip().upper().startswith(("INSERT", "UPDATE",
                                                                                                  "WITH", "DELETE"))]
    # the key row, the blob links (none here), the audit event: never one per event
    assert len(writes) == 3, writes
    assert {e.payload["email"] for e in Event.objects.read("big-1")} == {FORGOTTEN}


def test_a_state_that_declares_an_error_for_forgotten_data_raises_it(sealed):
    Event.objects.append("PrivacyPerson-p1", [Envelope("AgeSet", {"person": "p1", "age": 41})])
    assert load(fx.people, "p1").state.age == 41
    forget("p1", by="ops")
    with pytest.raises(ForgottenData, match="age"):
        load(fx.people, "p1")


def test_a_forgotten_subject_written_again_keeps_only_the_marker(sealed):
    forget("c-5", by="ops")
    Event.objects.append("late-1", [Envelope("PrivacyOrder", {"customer_id": "c-5", "email": "late@example.org"})])
    assert "late@example.org" not in raw_rows()
    assert Event.objects.read("late-1")[0].payload["email"] == FORGOTTEN


def test_a_projection_rebuilt_after_forget_holds_no_trace(sealed):
    """A read model fed from the log (here: every read of read_after, the projections' read) sees only the
    marker once the subject is forgotten."""
    Event.objects.append("proj-1", [Envelope("PrivacyOrder", {"customer_id": "c-6", "email": "p@example.org"})])

    def rebuilt() -> set:
        found = store_for(Event.objects.db).read_after([("proj-1", -1)], 10)[("proj-1", -1)]
        return {e.payload["email"] for e in found}

    assert rebuilt() == {"p@example.org"}
    forget("c-6", by="ops")
    assert rebuilt() == {FORGOTTEN}


# -- disclosure ---------------------------------------------------------------------------------------------


def test_a_reader_sees_a_field_only_as_its_owner_or_in_an_allowed_role(sealed):
    do(fx.register, "c-7", {"email": "own@example.org"}, actor="c-7")
    stream = "PrivacyCustomer-c-7"
    seen = lambda reader: Event.objects.read(stream, reader=reader)[0].payload["email"]  # noqa: E731
    assert seen(Reader("c-7")) == "own@example.org"
    assert seen(Reader("c-8")) == WITHHELD
    assert seen(Reader("c-8", frozenset({"support"}))) == "own@example.org"  # Sensitive(discloses=("support",))
    assert seen(Reader("c-8", frozenset({"privacy"}))) == "own@example.org"  # LOOM_DISCLOSE_ROLES
    assert seen(None) == "own@example.org"  # the system


def test_the_admin_withholds_sensitive_fields_from_staff_without_the_permission(sealed, client, django_user_model):
    from django.contrib.auth.models import Permission

    start("test.privacy.signup", {"customer_id": "c-9", "email": "adm@example.org"}, execution_id="px-9")
    staff = django_user_model.objects.create_user("viewer", password="pw-long-enough-1", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_execution"))
    client.force_login(staff)
    page = client.get("/admin/journal/execution/px-9/change/").content.decode()
    assert "adm@example.org" not in page and "&lt;redacted&gt;" in page
    staff.user_permissions.add(Permission.objects.get(codename="disclose_personal_data"))
    staff = django_user_model.objects.get(pk=staff.pk)
    client.force_login(staff)
    assert "adm@example.org" in client.get("/admin/journal/execution/px-9/change/").content.decode()


# -- keys ---------------------------------------------------------------------------------------------------


def test_rotating_the_master_key_keeps_old_events_readable(sealed):
    Event.objects.append("rot-1", [Envelope("PrivacyOrder", {"customer_id": "r1", "email": "rot@example.org"})])
    sealed.LOOM_KEYS = [fx.KEY_B, fx.KEY_A]  # B wraps new keys; A still unwraps old ones
    keys.cache.clear()
    assert Event.objects.read("rot-1")[0].payload["email"] == "rot@example.org"
    assert keys.rotate(store_for(Event.objects.db)) == 1
    sealed.LOOM_KEYS = [fx.KEY_B]  # A retired: every data key is wrapped by B now
    keys.cache.clear()
    assert Event.objects.read("rot-1")[0].payload["email"] == "rot@example.org"
    assert [m.id for m in run_checks() if m.id.startswith("loom.E03")] == []


def test_a_missing_or_wrong_master_key_is_a_system_check_error_and_never_garbage(sealed):
    Event.objects.append("key-1", [Envelope("PrivacyOrder", {"customer_id": "k1", "email": "k@example.org"})])
    sealed.LOOM_KEYS = [fx.KEY_B]
    keys.cache.clear()
    errors = [m for m in run_checks() if m.id == "loom.E031"]
    assert errors and "'ka'" in errors[0].msg and "does not hold" in errors[0].msg
    with pytest.raises(MasterKeyError):
        Event.objects.read("key-1")
    sealed.LOOM_KEYS = [fx.KEY_A_WRONG]
    keys.cache.clear()
    errors = [m for m in run_checks() if m.id == "loom.E031"]
    assert errors and "wrong key" in errors[0].msg
    sealed.LOOM_KEYS = []
    assert [m.id for m in run_checks() if m.id == "loom.E030"] == ["loom.E030"]
    sealed.LOOM_KEYS = ["ka:not-base64!"]
    assert any("LOOM_KEYS" in m.msg for m in run_checks() if m.id == "loom.E001")


def test_tampered_ciphertext_is_detected_and_named(sealed):
    Event.objects.append("tam-1", [Envelope("PrivacyOrder", {"customer_id": "t1", "email": "t@example.org"})])
    stored = raw_payloads("tam-1")[0]
    raw = bytearray(base64.b64decode(stored["email"]))
    raw[-1] ^= 1
    stored["email"] = base64.b64encode(bytes(raw)).decode()
    Event.objects.filter(stream_id="tam-1").update(payload=stored)  # an attacker with write access to the table
    with pytest.raises(TamperedCiphertext, match=r"tam-1#0 field email"):
        Event.objects.read("tam-1")


def test_every_field_of_a_read_has_its_tag_checked_not_only_the_first_of_a_shared_header(sealed):
    """Twenty events with the same header (one field, one subject): the read plans the header once, and the
    last event's changed ciphertext is still detected and named."""
    Event.objects.append("tam-2", [Envelope("PrivacyOrder", {"customer_id": "t2", "email": f"{n}@example.org"})
                                   for n in range(20)])
    stored = raw_payloads("tam-2")[19]
    raw = bytearray(base64.b64decode(stored["email"]))
    raw[NONCE_END] ^= 1  # the first byte of the ciphertext
    stored["email"] = base64.b64encode(bytes(raw)).decode()
    Event.objects.filter(stream_id="tam-2", seq=19).update(payload=stored)
    with pytest.raises(TamperedCiphertext, match=r"tam-2#19 field email"):
        Event.objects.read("tam-2")
    assert [e.payload["email"] for e in Event.objects.read("tam-2", limit=19)] == [f"{n}@example.org"
                                                                                  for n in range(19)]


# -- content store -------------------------------------------------------------------------------------------


def test_large_payloads_go_to_the_content_store_once_and_resolve_in_one_call(sealed):
    sealed.LOOM_CONTENT_THRESHOLD_BYTES = 200
    body = {"text": "x" * 500}
    Event.objects.append("cs-1", [Envelope("Doc", body) for _ in range(20)] + [Envelope("Doc", {"small": 1})])
    stored = raw_payloads("cs-1")
    assert stored[0] == stored[1] and set(stored[0]) == {"$content", "$size"} and stored[-1] == {"small": 1}
    cs = content_store.store()
    calls = cs.batches
    events = Event.objects.read("cs-1")
    assert cs.batches == calls + 1
    assert [e.payload for e in events] == [body] * 20 + [{"small": 1}]


def test_a_sealed_blob_is_erased_by_forget(sealed, django_capture_on_commit_callbacks):
    Event.objects.append("blob-1", [Envelope("PrivacyScan", {"customer_id": "b1", "image": "PIXELS" * 50})])
    sha = raw_payloads("blob-1")[0]["image"]
    cs = content_store.store()
    assert cs.exists(sha) and b"PIXELS" not in cs.storage.open(cs.name(sha)).read()
    assert Event.objects.read("blob-1")[0].payload["image"] == "PIXELS" * 50
    with django_capture_on_commit_callbacks(execute=True):
        forget("b1", by="ops")
    assert not cs.exists(sha)
    assert Event.objects.read("blob-1")[0].payload["image"] == FORGOTTEN


def test_a_plain_blob_field_is_stored_by_reference_and_deduplicated(sealed):
    Event.objects.append("blob-2", [Envelope("PrivacyAttachment", {"data": "same"})] * 2)
    refs = [p["data"] for p in raw_payloads("blob-2")]
    assert refs[0] == refs[1] and len(refs[0]) == 64
    assert [e.payload for e in Event.objects.read("blob-2")] == [{"data": "same"}] * 2


# -- inputs ----------------------------------------------------------------------------------------------------

values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                      | st.text(), lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8)


@hsettings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=values, subject=st.text(max_size=20) | st.integers())
def test_any_value_is_sealed_and_read_back_or_refused_with_nothing_written(sealed, value, subject):
    """Whatever the field holds and whoever the subject is: read back equal (the journal's JSON normal form),
    or InvalidPayload and no event."""
    from journal import jsonvalues

    stream = "hyp-1"
    Event.objects.filter(stream_id=stream)._raw_delete(Event.objects.db)
    payload = {"customer_id": subject, "email": value}
    try:
        Event.objects.append(stream, [Envelope("PrivacyOrder", payload)])
    except InvalidPayload:
        assert Event.objects.read(stream) == []
        return
    got = Event.objects.read(stream)[0].payload
    assert got == json.loads(jsonvalues.dumps(payload))


# -- concurrency ----------------------------------------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_forget_and_append_of_one_subject_leave_no_plaintext(sealed):
    """Writers keep appending the subject's data while another thread forgets it: afterwards no table holds
    any of it in clear and every read shows the marker."""
    errors: list[BaseException] = []
    stop = threading.Event()

    def writer(n: int) -> None:
        try:
            i = 0
            while not stop.is_set() and i < 40:
                Event.objects.append(f"race-{n}", [Envelope("PrivacyOrder", {"customer_id": "victim",
                                                                            "email": f"secret-{n}-{i}@x"})])
                i += 1
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    forget("victim", by="ops")
    stop.set()
    for t in threads:
        t.join()
    assert errors == []
    assert "secret-" not in raw_rows()
    for n in range(4):
        assert {e.payload["email"] for e in Event.objects.read(f"race-{n}")} <= {FORGOTTEN}


# -- HTTP API ----------------------------------------------------------------------------------------------------


def test_the_api_shows_a_sensitive_field_only_to_its_owner_or_an_allowed_role(sealed, client):
    sealed.LOOM_API_AUTH = True
    sealed.LOOM_API_TOKENS = [{"token": "tok-owner-0123456789", "name": "c-10"},
                              {"token": "tok-other-0123456789", "name": "other"},
                              {"token": "tok-dpo-0123456789ab", "name": "dpo", "roles": ["privacy"]}]
    start("test.privacy.signup", {"customer_id": "c-10", "email": "api@example.org"}, execution_id="px-10")

    def seen(token: str) -> str:
        body = client.get("/api/executions/px-10", headers={"Authorization": f"Bearer {token}"})
        assert body.status_code == 200
        return json.dumps(body.json())

    assert "api@example.org" in seen("tok-owner-0123456789")
    assert "api@example.org" in seen("tok-dpo-0123456789ab")
    other = seen("tok-other-0123456789")
    assert "api@example.org" not in other and WITHHELD in other
    forget("c-10", by="dpo")
    for token in ("tok-owner-0123456789", "tok-dpo-0123456789ab", "tok-other-0123456789"):
        shown = seen(token)
        assert "api@example.org" not in shown and "hi api" not in shown


def test_loom_keys_prints_a_usable_key_and_rotates(sealed):
    import io

    from django.core.management import call_command

    out = io.StringIO()
    call_command("loom_keys", "new", "--id", "k9", stdout=out)
    entry = out.getvalue().strip()
    Event.objects.append("cmd-1", [Envelope("PrivacyOrder", {"customer_id": "m1", "email": "cmd@example.org"})])
    sealed.LOOM_KEYS = [entry, fx.KEY_A]
    keys.cache.clear()
    out = io.StringIO()
    call_command("loom_keys", "rotate", stdout=out)
    assert "rewrapped 1 data key(s) with master key k9" in out.getvalue()
    sealed.LOOM_KEYS = [entry]
    keys.cache.clear()
    assert Event.objects.read("cmd-1")[0].payload["email"] == "cmd@example.org"


@pytest.mark.django_db(transaction=True)
def test_a_projection_reset_and_rebuilt_after_forget_holds_only_the_marker(sealed):
    """A real projection (drained, then reset and replayed from the log, as an operator rebuilds one) sees
    the subject's e-mail before the forget and only the marker after."""
    from projections.admin import reset_consumers
    from projections.declarations import projection, registry
    from projections.service import drain

    model: dict[str, str] = {}
    registry.clear()
    try:
        projection("privacy-emails", on=["PrivacyOrder"], reset=model.clear,
                   handler=lambda event, target: model.__setitem__(f"{event.stream_id}#{event.seq}",
                                                                    event.payload["email"]))
        Event.objects.append("pr-1", [Envelope("PrivacyOrder", {"customer_id": "c-11", "email": "p1@example.org"}),
                                      Envelope("PrivacyOrder", {"customer_id": "c-12", "email": "p2@example.org"})])
        drain()
        assert model == {"pr-1#0": "p1@example.org", "pr-1#1": "p2@example.org"}
        forget("c-11", by="ops")
        assert reset_consumers({"privacy-emails"}) == 1 and model == {}
        drain()
        assert model == {"pr-1#0": FORGOTTEN, "pr-1#1": "p2@example.org"}
    finally:
        registry.clear()


def test_an_external_key_service_wraps_and_unwraps_the_data_keys(sealed):
    sealed.LOOM_KEYS = []
    sealed.LOOM_KEY_SERVICE = "tests.fixtures.privacy_fixtures.FakeKms"
    before = fx.FakeKms.calls
    Event.objects.append("kms-1", [Envelope("PrivacyOrder", {"customer_id": "kms-c", "email": "kms@example.org"})])
    keys.cache.clear()
    assert Event.objects.read("kms-1")[0].payload["email"] == "kms@example.org"
    assert fx.FakeKms.calls - before == 2  # one wrap when the key was made, one unwrap for the read
    assert store_for(Event.objects.db).data_keys(["kms-c"])["kms-c"][0] == "kms-1"
    assert [m.id for m in run_checks() if m.id.startswith("loom.E03")] == []


def test_a_flow_with_marked_data_is_never_checkpointed_and_others_still_are(sealed, settings):
    """LOOM_SNAPSHOT_EVERY checkpoints executions; one whose input or step results are marked is not (its
    snapshot would hold them in clear), while an unmarked flow in the same process still is."""
    from journal.models import Snapshot

    settings.LOOM_SNAPSHOT_EVERY = 1
    start("test.privacy.signup", {"customer_id": "c-13", "email": "snap@example.org"}, execution_id="px-13")
    start("test.add", {"a": 1, "b": 2}, execution_id="plain-13")
    assert Snapshot.objects.latest("px-13") is None
    assert Snapshot.objects.latest("plain-13") is not None


@pytest.fixture
def in_memory_content(sealed):
    """The content store on another Django storage than the file system: InMemoryStorage, named in STORAGES
    and chosen by LOOM_CONTENT_STORAGE (what a django-storages backend is configured like)."""
    sealed.STORAGES = {**sealed.STORAGES,
                       "loom_content": {"BACKEND": "django.core.files.storage.InMemoryStorage"}}
    sealed.LOOM_CONTENT_STORAGE = "loom_content"
    yield sealed


def test_the_content_store_works_on_a_storage_that_is_not_the_file_system(in_memory_content,
                                                                         django_capture_on_commit_callbacks):
    from django.core.files.storage import InMemoryStorage

    in_memory_content.LOOM_CONTENT_THRESHOLD_BYTES = 200
    cs = content_store.store()
    assert isinstance(cs.storage, InMemoryStorage)
    body = {"text": "y" * 500}
    Event.objects.append("mem-1", [Envelope("Doc", body) for _ in range(5)])
    stored = raw_payloads("mem-1")
    assert len({p["$content"] for p in stored}) == 1 and cs.exists(stored[0]["$content"])  # stored once
    calls = cs.batches
    assert [e.payload for e in Event.objects.read("mem-1")] == [body] * 5
    assert cs.batches == calls + 1
    Event.objects.append("mem-2", [Envelope("PrivacyScan", {"customer_id": "m1", "image": "PIXELS" * 50})])
    sha = raw_payloads("mem-2")[0]["image"]
    assert cs.exists(sha) and b"PIXELS" not in cs.storage.open(cs.name(sha)).read()
    with django_capture_on_commit_callbacks(execute=True):
        forget("m1", by="ops")
    assert not cs.exists(sha)  # erased from that storage too
    assert Event.objects.read("mem-2")[0].payload["image"] == FORGOTTEN
