"""The HTTP API's execution list and cancel (issue #28): filters, cursor pages, scopes (a flow outside a
token's patterns, another token's executions under "read": "own", are invisible), every refused query
parameter a named 400 that reads nothing; cancel of a queued, a waiting and a running execution, idempotent,
scoped, and refused (409) for a settled one. Starts stay queued here: no worker runs in this process."""

from __future__ import annotations

import base64
import json
from datetime import datetime, timedelta

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from journal.flows import Context, flow, start
from journal.models import Event, Execution
from tests.fixtures import admin_flows as af

pytestmark = pytest.mark.django_db(transaction=True)

FULL = "full-token-0123456789abcdef"
CALC = "calc-token-0123456789abcdef"
OWN = "own-token-0123456789abcdef0"


@flow("tests.apilist.sleeper")
def sleeper(ctx: Context, value):
    ctx.sleep(3600)
    return "woke"


@flow("calc.apilist_echo")
def echo(ctx: Context, value):
    return ctx.step("echo", lambda: value)


@pytest.fixture(autouse=True)
def api_settings(settings):
    settings.LOOM_API_AUTH = True
    settings.LOOM_API_TOKENS = [FULL, {"token": CALC, "name": "calc", "flows": ["calc.*"]},
                                {"token": OWN, "name": "own", "read": "own"}]
    settings.LOOM_FLOW_MODULES = ["tests.fixtures.admin_flows"]
    af.CRASH = False


def get(client, path: str, token: str = FULL, **params):
    return client.get(path, params, headers={"Authorization": f"Bearer {token}"})


def post(client, path: str, body=None, token: str = FULL):
    data = "" if body is None else json.dumps(body)
    return client.post(path, data=data, content_type="application/json",
                       headers={"Authorization": f"Bearer {token}"})


def api_start(client, flow_name: str, execution_id: str, token: str = FULL) -> None:
    response = post(client, f"/api/flows/{flow_name}/executions", {"input": {"n": 1}, "execution_id": execution_id},
                    token)
    assert response.status_code == 202, response.content


def ids(response) -> list[str]:
    assert response.status_code == 200, response.content
    return [row["execution_id"] for row in response.json()["executions"]]


def test_the_list_filters_pages_with_a_cursor_and_hides_what_a_token_may_not_read(client):
    for n in range(5):
        api_start(client, "calc.apilist_echo", f"al-calc-{n}", FULL)
    api_start(client, "tests.apilist.sleeper", "al-own-1", OWN)
    api_start(client, "tests.apilist.sleeper", "al-full-1", FULL)
    Execution.objects.filter(pk="al-calc-0").update(created_at=timezone.now() - timedelta(days=2))
    every = ids(get(client, "/api/executions"))
    assert set(every) == {*(f"al-calc-{n}" for n in range(5)), "al-own-1", "al-full-1"}
    assert every[-1] == "al-calc-0"  # newest first
    # pages of 2 with the cursor: every row once, in the same order
    seen, cursor = [], None
    while True:
        params = {"limit": "2", **({"cursor": cursor} if cursor else {})}
        body = get(client, "/api/executions", **params).json()
        seen += [row["execution_id"] for row in body["executions"]]
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert seen == every
    assert set(ids(get(client, "/api/executions", flow="tests.apilist.sleeper"))) == {"al-own-1", "al-full-1"}
    assert ids(get(client, "/api/executions", status="completed")) == []
    assert set(ids(get(client, "/api/executions", status="queued"))) == set(every)
    before = (timezone.now() - timedelta(days=1)).isoformat()
    assert ids(get(client, "/api/executions", created_before=before)) == ["al-calc-0"]
    assert "al-calc-0" not in ids(get(client, "/api/executions", created_after=before))
    # scopes: the calc token sees only calc.* flows; the "own" token only what it started
    assert set(ids(get(client, "/api/executions", CALC))) == {f"al-calc-{n}" for n in range(5)}
    assert ids(get(client, "/api/executions", CALC, flow="tests.apilist.sleeper")) == []
    assert ids(get(client, "/api/executions", OWN)) == ["al-own-1"]
    row = get(client, "/api/executions", OWN).json()["executions"][0]
    assert (row["flow"], row["status"], row["error"]) == ("tests.apilist.sleeper", "queued", None)


def test_cancel_ends_a_queued_a_waiting_and_a_running_execution_once_and_refuses_a_settled_one(client):
    api_start(client, "tests.apilist.sleeper", "ac-queued")
    start("tests.apilist.sleeper", {}, execution_id="ac-waiting")
    assert Execution.objects.get(pk="ac-waiting").status == "waiting"
    af.CRASH = True
    try:
        with pytest.raises(af.Crash):
            start("admin.crash_once", {}, execution_id="ac-running")
    finally:
        af.CRASH = False
    start("calc.apilist_echo", {"n": 2}, execution_id="ac-done")
    for execution_id, was in (("ac-queued", "queued"), ("ac-waiting", "waiting"), ("ac-running", "running")):
        response = post(client, f"/api/executions/{execution_id}/cancel", {"reason": "not needed"})
        assert response.status_code == 200, response.content
        assert response.json() | {} == {"execution_id": execution_id, "flow": response.json()["flow"],
                                         "status": "cancelled", "reason": "not needed", "cancelled": True,
                                         "was": was}
        assert Execution.objects.get(pk=execution_id).status == "cancelled"
        events = Event.objects.filter(stream_id=execution_id).count()
        again = post(client, f"/api/executions/{execution_id}/cancel")
        assert again.status_code == 200 and again.json()["cancelled"] is False
        assert Event.objects.filter(stream_id=execution_id).count() == events  # nothing more written
    refused = post(client, "/api/executions/ac-done/cancel")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "execution_finished"
    assert Execution.objects.get(pk="ac-done").status == "completed"


def test_cancel_is_scoped_like_a_read(client):
    api_start(client, "tests.apilist.sleeper", "as-full")
    for token in (CALC, OWN):  # outside the calc token's flows; not started by the own token
        response = post(client, "/api/executions/as-full/cancel", token=token)
        assert response.status_code == 404 and response.json()["error"]["code"] == "unknown_execution"
    assert Execution.objects.get(pk="as-full").status == "queued"
    assert post(client, "/api/executions/as-full/cancel", {"why": 1}).status_code == 400
    assert Execution.objects.get(pk="as-full").status == "queued"


VALUES = st.one_of(st.text(st.characters(exclude_categories=("Cs",)), max_size=30),  # (a URL cannot carry a surrogate)
                   st.sampled_from(["0", "201", "-1", "1.5", "Z", "2026-13-01", "\x00", "bm90IGEgY3Vyc29y",
                                    "2026-12-01T10:00:00Z", "running", "completed"]))


def _encoded(raw: str | bytes) -> str:
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


# Crafted cursors: base64url of `<time>|<id>` with any time (an offset that overflows at the ends of the range
# included) and any id (a NUL, a control character, a lone surrogate, too long), or of any bytes at all.
CURSORS = st.one_of(
    st.builds(lambda when, sep, ident: _encoded(f"{when}{sep}{ident}"),
              st.one_of(st.datetimes(timezones=st.timezones()).map(datetime.isoformat),
                        st.sampled_from(["0001-01-01T00:00:00+05:00", "9999-12-31T23:59:59-05:00",
                                         "2026-12-01T10:00:00", "2026-12-01T10:00:00+00:00"])),
              st.sampled_from(["|", "", "||"]),
              st.one_of(st.text(max_size=30), st.sampled_from(["a\x00b", "\x00", "x" * 201, "\ud800", "ok-id"]))),
    st.binary(max_size=40).map(_encoded))


@hsettings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(["flow", "status", "created_after", "created_before", "limit", "cursor", "sort",
                             "page", "q"]), value=VALUES, crafted=CURSORS)
def test_every_refused_query_parameter_is_a_named_400_and_changes_nothing(client, name, value, crafted):
    from loomapi.listing import list_query

    class Params(dict):
        def getlist(self, key):
            return [self[key]]

    if not Execution.objects.filter(pk="al-hyp").exists():  # a row to read: a refusal must not reach the database
        api_start(client, "tests.apilist.sleeper", "al-hyp")
    writes = (Event.objects.count(), Execution.objects.count())
    for param, text in ((name, value), ("cursor", crafted)):  # the second: an arbitrary cursor, decoded by us
        response = client.get("/api/executions", {param: text}, headers={"Authorization": f"Bearer {FULL}"})
        try:
            list_query(Params({param: text}))
            refused = False
        except Exception as exc:  # the named refusal the view answers with
            assert type(exc).__name__ == "InvalidParameter"
            refused = True
        if refused:
            assert response.status_code == 400, (param, text, response.content)
            # (a NUL is refused by the site's hostile-query middleware first: its own named 400)
            assert response.json()["error"]["code"] in ("invalid_parameter", "bad_request")
        else:
            assert response.status_code == 200, (param, text, response.content)
            assert "executions" in response.json()
    assert (Event.objects.count(), Execution.objects.count()) == writes
    twice = client.get("/api/executions?limit=1&limit=2", headers={"Authorization": f"Bearer {FULL}"})
    assert twice.status_code == 400 and twice.json()["error"]["code"] == "invalid_parameter"


class JournalElsewhere:
    """A project's router sending the journal to a database of its own (an alias this test has not got: the
    list must ask that alias, and so fails naming it, instead of reading "default")."""

    def db_for_write(self, model, **hints):
        return "r1-journal-db" if model._meta.app_label == "journal" else None

    db_for_read = db_for_write


def test_the_list_reads_the_database_the_project_routes_the_journal_to(client, settings):
    from django.utils.connection import ConnectionDoesNotExist

    from journal import shards
    from loomapi.auth import Principal
    from loomapi.listing import ListQuery, page

    api_start(client, "tests.apilist.sleeper", "al-routed")
    assert [r["execution_id"] for r in page(Principal("full"), ListQuery())["executions"]] == ["al-routed"]
    settings.DATABASE_ROUTERS = [f"{__name__}.JournalElsewhere"]
    assert shards.shards() == ["r1-journal-db"] and not shards.sharded()
    with pytest.raises(ConnectionDoesNotExist, match="r1-journal-db"):
        page(Principal("full"), ListQuery())


@flow("calc.apilist_tree")
def calc_tree(ctx: Context, value):
    """A flow the calc token reads, whose child (tests.apilist.sleeper) it may not read."""
    ctx.start_child("tests.apilist.sleeper", {}, execution_id="at-hidden-child")
    return "started"


@flow("tests.apilist.tree")
def tree(ctx: Context, value):
    """A flow the calc token may not read, whose child (calc.apilist_echo) it reads."""
    ctx.start_child("calc.apilist_echo", {"n": 2}, execution_id="at-seen-child")
    return "started"


def test_the_parent_and_children_of_an_execution_are_shown_only_when_the_token_may_read_them(client):
    """GET of an execution names its parent and children (and their ids in its steps and events) only when
    this token may read them (docs/http-api.md): a calc.* token sees neither the tests.* child of its flow nor
    the tests.* parent of its child."""
    from journal.flows.ownership import get_ownership, set_ownership

    installed = get_ownership()
    set_ownership(None)  # the runs are short: no lease keeper thread that would outlive the test
    try:
        start("calc.apilist_tree", {}, execution_id="at-calc-parent")
        start("tests.apilist.tree", {}, execution_id="at-hidden-parent")
    finally:
        set_ownership(installed)
    assert Execution.objects.filter(pk__in=["at-hidden-child", "at-seen-child"]).count() == 2
    full = get(client, "/api/executions/at-calc-parent").json()
    assert full["children"] == ["at-hidden-child"]
    assert get(client, "/api/executions/at-seen-child").json()["parent"] == "at-hidden-parent"
    calc = get(client, "/api/executions/at-calc-parent", token=CALC)
    assert calc.status_code == 200 and calc.json()["children"] == []
    child = get(client, "/api/executions/at-seen-child", token=CALC)
    assert child.status_code == 200 and child.json()["parent"] is None
    # nor anywhere else in the answer (the $start_child step's result, EXECUTION_STARTED's $parent)
    assert "at-hidden-child" not in calc.content.decode() and "<hidden>" in calc.content.decode()
    assert "at-hidden-parent" not in child.content.decode()
    assert "at-hidden-child" in json.dumps(full)  # what the full token reads is unchanged
    assert get(client, "/api/executions/at-hidden-parent", token=CALC).status_code == 404


def test_an_own_tokens_start_stored_as_a_content_reference_is_in_its_list_and_no_other_own_tokens(
        client, settings, tmp_path):
    """Over LOOM_CONTENT_THRESHOLD_BYTES the EXECUTION_STARTED row is `{"$content", "$size"}`, so SQL cannot see
    its `$meta.started_by`: the list reads such a candidate to decide. An own token lists its large starts (its
    pages of one row step through them in order), another own token none of them, whichever its page size."""
    other = "own2-token-0123456789abcdef"
    settings.LOOM_API_TOKENS = [*settings.LOOM_API_TOKENS, {"token": other, "name": "own2", "read": "own"}]
    settings.LOOM_CONTENT_THRESHOLD_BYTES = 300
    settings.LOOM_CONTENT_DIR = str(tmp_path / "content")
    started = [("ao-small", 1, OWN), ("ao-large", "x" * 400, OWN), ("ao-other-1", "y" * 400, other),
               ("ao-large-2", "z" * 400, OWN), ("ao-other-2", "w" * 400, other), ("ao-other-3", "v" * 400, other)]
    for execution_id, n, token in started:
        response = post(client, "/api/flows/tests.apilist.sleeper/executions",
                        {"input": {"n": n}, "execution_id": execution_id}, token)
        assert response.status_code == 202, response.content
    stored = Event.objects.filter(stream_id="ao-large", seq=0).values_list("payload", flat=True).get()
    assert set(stored) == {"$content", "$size"}
    newest_first = ["ao-large-2", "ao-large", "ao-small"]
    assert ids(get(client, "/api/executions", OWN)) == newest_first
    assert ids(get(client, "/api/executions", other)) == ["ao-other-3", "ao-other-2", "ao-other-1"]
    paged, cursor = [], None
    for _ in range(5):  # a page of one: the other token's candidates between are skipped, none repeated
        body = get(client, "/api/executions", OWN, limit=1, **({"cursor": cursor} if cursor else {})).json()
        paged += [row["execution_id"] for row in body["executions"]]
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert paged == newest_first and cursor is None
    assert ids(get(client, "/api/executions", other, limit=1)) == ["ao-other-3"]
    assert set(ids(get(client, "/api/executions"))) >= {e for e, _, _ in started}
    read = get(client, "/api/executions/ao-large", OWN)
    assert read.status_code == 200 and read.json()["input"] == {"n": "x" * 400}
    assert get(client, "/api/executions/ao-large", other).status_code == 404
