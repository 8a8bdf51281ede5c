"""The HTTP API against hostile or careless callers: token scopes, the stream namespace, input that is
not JSON we can store, trace ids, hung calls and retries (through Django's test client; the server-level
behaviours are in tests/api/test_api_server.py)."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from pydantic import BaseModel

from journal.aggregates.declarations import State
from journal.envelopes import Envelope
from journal.flows import Context, flow
from journal.models import Event, Execution
from tests.fixtures.api_flows import queued_starts_run_inline

pytestmark = pytest.mark.django_db

FULL = "full-token-0123456789abcdef"
CALC_ONLY = "calc-token-0123456789abcdef"
OWN_ONLY = "own-token-0123456789abcdef"
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class _Ticket(BaseModel):
    title: str = ""


TICKETS = State("ApiSafetyTicket", _Ticket)

_RETRY_STATE = {"fail": True}


@flow("tests.api_safety.echo")
def echo(ctx: Context, value):
    """No input_model: whatever JSON comes in is the input."""
    return value


@flow("tests.api_safety.huge")
def huge(ctx: Context, value):
    return 10 ** 5000


@flow("tests.api_safety.nan")
def not_a_number(ctx: Context, value):
    return float(value)


@flow("tests.api_safety.hangs")
def hangs(ctx: Context, value):
    time.sleep(value)
    return "woke"


@flow("tests.api_safety.flaky")
def flaky(ctx: Context, value):
    def step():
        if _RETRY_STATE["fail"]:
            raise RuntimeError("not yet")
        return "done"

    return ctx.step("work", step)


@pytest.fixture(autouse=True)
def api_settings(settings, monkeypatch):
    settings.LOOM_API_AUTH = True
    settings.LOOM_API_TOKENS = [FULL, {"token": CALC_ONLY, "name": "calc", "flows": ["calc.*"]},
                                {"token": OWN_ONLY, "name": "own", "read": "own"}]
    settings.LOOM_API_MAX_BODY_BYTES = 1 << 20
    # Queued starts run inside enqueue_start, in this process (tests/api/test_api_server.py runs the real
    # thing: serve_api and a loom_worker).
    with queued_starts_run_inline(monkeypatch):
        yield


def post(client, path: str, body, token: str = FULL, **extra):
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return client.post(path, data=data, content_type="application/json",
                       headers={"Authorization": f"Bearer {token}", **extra.pop("headers", {})}, **extra)


def get(client, path: str, token: str = FULL, **extra):
    return client.get(path, headers={"Authorization": f"Bearer {token}"}, **extra)


def error_code(response, status: int) -> str:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json"
    return response.json()["error"]["code"]


# -- the stream namespace: executions and aggregates ------------------------------------------------------

def test_an_aggregate_stream_is_not_readable_as_an_execution(client):
    Event.objects.append(TICKETS.stream("43"), Envelope("Opened", {"$meta": {"actor": "alice"}}))
    assert error_code(get(client, "/api/executions/ApiSafetyTicket-43"), 404) == "unknown_execution"


def test_a_start_in_an_aggregate_namespace_is_refused_and_the_aggregate_stays_loadable(client):
    response = post(client, "/api/flows/calc.add/executions", {"input": {"a": 1, "b": 2},
                                                                  "execution_id": "ApiSafetyTicket-44"})
    assert error_code(response, 409) == "execution_conflict"
    assert not Event.objects.filter(stream_id="ApiSafetyTicket-44").exists()


def test_a_start_under_an_existing_stream_that_is_not_an_execution_is_refused(client):
    Event.objects.append("loose-stream", Envelope("Something", {}))
    response = post(client, "/api/flows/calc.add/executions", {"input": {"a": 1, "b": 2},
                                                                  "execution_id": "loose-stream"})
    assert error_code(response, 409) == "execution_conflict"
    assert Event.objects.filter(stream_id="loose-stream").count() == 1
    assert not Execution.objects.filter(pk="loose-stream").exists()


# -- token scopes -----------------------------------------------------------------------------------------

def test_a_token_scoped_to_some_flows_may_not_start_or_call_others(client):
    body = {"input": {"value": 1}}
    assert error_code(post(client, "/api/flows/tests.api_safety.echo/call", body, CALC_ONLY), 404) == "unknown_flow"
    assert error_code(post(client, "/api/flows/tests.api_safety.echo/executions", body, CALC_ONLY), 404) \
        == "unknown_flow"
    assert Event.objects.count() == 0
    assert post(client, "/api/flows/calc.add/call", {"input": {"a": 1, "b": 2}}, CALC_ONLY).json()["result"] == 3


def test_a_read_own_token_reads_only_the_executions_it_started(client):
    post(client, "/api/flows/calc.add/executions", {"input": {"a": 1, "b": 2}, "execution_id": "mine"}, OWN_ONLY)
    post(client, "/api/flows/calc.add/executions", {"input": {"a": 1, "b": 2}, "execution_id": "theirs"}, FULL)
    assert get(client, "/api/executions/mine", OWN_ONLY).json()["result"] == 3
    assert error_code(get(client, "/api/executions/theirs", OWN_ONLY), 404) == "unknown_execution"
    # A full-access token reads both; a repeat of another token's start tells nothing about it.
    assert get(client, "/api/executions/mine", FULL).status_code == 200
    repeat = post(client, "/api/flows/calc.add/executions", {"input": {"a": 1, "b": 2}, "execution_id": "theirs"},
                  OWN_ONLY)
    assert error_code(repeat, 404) == "unknown_execution"  # issue #25: as GET answers, not 409 (an oracle)
    assert "result" not in repeat.json()


def test_tokens_from_the_environment_may_be_a_json_array_of_scoped_entries(settings, client):
    settings.LOOM_API_TOKENS = json.dumps([{"token": CALC_ONLY, "flows": ["calc.*"]}, FULL])
    assert post(client, "/api/flows/calc.add/call", {"input": {"a": 1, "b": 2}}, CALC_ONLY).status_code == 200
    assert post(client, "/api/flows/tests.api_safety.echo/call", {"input": 1}, CALC_ONLY).status_code == 404
    assert post(client, "/api/flows/tests.api_safety.echo/call", {"input": 1}, FULL).status_code == 200
    settings.LOOM_API_TOKENS = f"{FULL},{CALC_ONLY}"  # the old comma-separated form: full access each
    assert post(client, "/api/flows/tests.api_safety.echo/call", {"input": 1}, CALC_ONLY).status_code == 200


def test_an_unreadable_token_entry_is_a_system_check_error(settings):
    from loomapi.checks import check_api_tokens

    settings.LOOM_API_TOKENS = [{"token": "x", "read": "everything"}]
    assert [e.id for e in check_api_tokens()] == ["loom.E201"]
    settings.LOOM_API_TOKENS = [FULL]
    assert check_api_tokens() == []


# -- 4xx, not 500: input we cannot take -------------------------------------------------------------------

def test_deeply_nested_json_is_400(client):
    body = '{"input": ' + "[" * 100_000 + "]" * 100_000 + "}"
    assert error_code(post(client, "/api/flows/tests.api_safety.echo/call", body), 400) == "malformed_json"


@pytest.mark.parametrize("path", ["/api/executions/a%00b", "/api/executions/%E2%80%AEevil", "/api/executions/.."])
def test_an_execution_id_outside_the_alphabet_reads_as_unknown(client, path):
    assert error_code(get(client, path), 404) == "unknown_execution"


@pytest.mark.parametrize("execution_id", ["\\ud800", "a\\u0000b", "\\u202eabc", "../../admin"])
def test_an_execution_id_outside_the_alphabet_is_400(client, execution_id):
    body = '{"input": {"a": 1, "b": 2}, "execution_id": "' + execution_id + '"}'
    assert error_code(post(client, "/api/flows/calc.add/executions", body), 400) == "invalid_body"
    assert Event.objects.count() == 0


@pytest.mark.parametrize("endpoint", ["call", "executions"])
@pytest.mark.parametrize("body", ['{"input": "a\\u0000b"}', '{"input": {"k": "\\udc00"}}',
                                  '{"input": 1, "state": {"\\u0000": 1}}', '{"input": NaN}',
                                  '{"input": [Infinity]}'])
def test_nul_a_lone_surrogate_or_nan_in_the_input_or_state_is_400(client, endpoint, body):
    response = post(client, f"/api/flows/tests.api_safety.echo/{endpoint}", body)
    assert error_code(response, 400) in ("invalid_body", "malformed_json")
    assert Event.objects.count() == 0


def test_an_escaped_backslash_u0000_is_text_not_nul(client):
    response = post(client, "/api/flows/tests.api_safety.echo/call", '{"input": "\\\\u0000"}')
    assert response.json()["result"] == "\\u0000"


@pytest.mark.parametrize(("flow_name", "value"), [("tests.api_safety.huge", 0), ("tests.api_safety.nan", "nan"),
                                                  ("tests.api_safety.nan", "inf")])
def test_a_transient_result_json_cannot_carry_is_a_failed_call(client, flow_name, value):
    response = post(client, f"/api/flows/{flow_name}/call", {"input": value})
    assert response.status_code == 200
    body = json.loads(response.content)  # strict JSON: no NaN in the answer
    assert body["status"] == "failed" and "JSON" in body["error"]


def test_a_disallowed_host_gets_a_json_400_under_the_api(client):
    response = client.get("/api/health", headers={"Host": "evil.example"})
    assert error_code(response, 400) == "bad_request"
    assert response["Connection"] == "close"
    page = client.get("/bench/", headers={"Host": "evil.example"})
    assert page.status_code == 400 and page["Content-Type"].startswith("text/html")  # elsewhere: Django's page


def test_head_of_health_is_200(client):
    assert client.head("/api/health").status_code == 200


def test_a_refused_request_whose_body_was_not_read_closes_the_connection(client):
    response = client.post("/api/flows/calc.add/call", data="x" * 200_000, content_type="application/json",
                           headers={"Authorization": "Bearer wrong-token-0123456789"})
    assert error_code(response, 401) == "unauthorized"
    assert response["Connection"] == "close"
    ok = post(client, "/api/flows/calc.add/call", {"input": {"a": 1, "b": 2}})
    assert not ok.has_header("Connection")  # a served request keeps its connection


# -- trace ids --------------------------------------------------------------------------------------------

def test_a_start_records_the_callers_trace_and_token_in_the_execution(client):
    response = post(client, "/api/flows/calc.add/executions", {"input": {"a": 1, "b": 2}, "execution_id": "traced"},
                    headers={"traceparent": TRACEPARENT})
    trace_id = TRACEPARENT.split("-")[1]
    assert response["traceparent"].split("-")[1] == trace_id
    assert response["traceparent"].split("-")[2] != TRACEPARENT.split("-")[2]  # our own span
    started = get(client, "/api/executions/traced").json()["events"][0]
    assert started["type"] == "EXECUTION_STARTED"
    meta = started["payload"]["$meta"]
    assert meta["trace_id"] == trace_id
    assert meta["started_by"].startswith("token-") and FULL not in json.dumps(meta)


@pytest.mark.parametrize("header", [None, "garbage", "00-" + "0" * 32 + "-00f067aa0ba902b7-01"])
def test_a_trace_id_is_minted_without_a_valid_traceparent(client, header):
    headers = {"traceparent": header} if header else {}
    response = client.get("/api/health", headers=headers)
    version, trace_id, span_id, _flags = response["traceparent"].split("-")
    assert (version, len(trace_id), len(span_id)) == ("00", 32, 16)
    assert trace_id != "0" * 32


# -- hung calls -------------------------------------------------------------------------------------------

def test_a_call_past_its_timeout_is_a_504_with_the_call_id(client, settings, caplog):
    settings.LOOM_API_CALL_TIMEOUT = 0.2
    response = post(client, "/api/flows/tests.api_safety.hangs/call", {"input": 1.5})
    assert error_code(response, 504) == "call_timeout"
    call_id = response.json()["error"]["id"]
    assert call_id and call_id in response.json()["error"]["message"]
    assert any(call_id in record.getMessage() for record in caplog.records)
    assert response["Connection"] == "close"


# -- retry ------------------------------------------------------------------------------------------------

def test_retry_of_a_failed_execution_through_the_api(client):
    _RETRY_STATE["fail"] = True
    try:
        started = post(client, "/api/flows/tests.api_safety.flaky/executions?wait=5",
                       {"input": {}, "execution_id": "to-retry"})
        assert started.json()["status"] == "failed"
        _RETRY_STATE["fail"] = False
        response = client.post("/api/executions/to-retry/retry", headers={"Authorization": f"Bearer {FULL}"})
        assert response.status_code == 202, response.content
        assert response["Location"] == "/api/executions/to-retry"
        body = get(client, "/api/executions/to-retry").json()
        assert (body["status"], body["result"]) == ("completed", "done")
        assert "EXECUTION_RETRIED" in [e["type"] for e in body["events"]]
        again = client.post("/api/executions/to-retry/retry", headers={"Authorization": f"Bearer {FULL}"})
        assert error_code(again, 409) == "execution_conflict"  # only a failed execution is retried
    finally:
        _RETRY_STATE["fail"] = True


def test_retry_of_an_unknown_or_unreadable_execution_is_404(client):
    post(client, "/api/flows/calc.add/executions", {"input": {"a": 1, "b": 2}, "execution_id": "not-mine"})
    assert error_code(client.post("/api/executions/not-mine/retry",
                                  headers={"Authorization": f"Bearer {OWN_ONLY}"}), 404) == "unknown_execution"
    assert error_code(client.post("/api/executions/nope/retry",
                                  headers={"Authorization": f"Bearer {FULL}"}), 404) == "unknown_execution"


def test_short_tokens_are_reported_whether_plain_or_scoped(settings):
    from loomapi.checks import check_api_auth

    settings.LOOM_API_AUTH = True
    settings.LOOM_API_TOKENS = [FULL, {"token": "short-scoped", "flows": ["calc.*"]}]
    assert [w.id for w in check_api_auth()] == ["loom.W203"]
    settings.LOOM_API_TOKENS = [FULL, {"token": CALC_ONLY}]
    assert check_api_auth() == []


# -- the buffering worker's view of a request (loomapi/worker.py) ---------------------------------------------

HEAD = b"POST /api/flows/calc.add/call HTTP/1.1\r\nHost: x\r\n"


@pytest.mark.parametrize(("buffer", "whole"), [
    (b"GET /api/health HTTP/1.1\r\nHost: x\r\n", False),                      # head not finished
    (b"GET /api/health HTTP/1.1\r\nHost: x\r\n\r\n", True),                   # no body
    (HEAD + b"Content-Length: 10\r\n\r\n01234", False),                        # half the body
    (HEAD + b"Content-Length: 10\r\n\r\n0123456789", True),
    (HEAD + b"Content-Length: 999999999\r\n\r\n", True),                       # over the limit: refused at once
    (HEAD + b"Content-Length: ten\r\n\r\n", True),                             # malformed: the parser says 400
    (HEAD + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n", False),       # no last chunk yet
    (HEAD + b"Transfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n0\r\n\r\n", True),
    (HEAD + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-Trailer: 1\r\n", False),  # trailers unfinished
    (HEAD + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-Trailer: 1\r\n\r\n", True),
    (HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n", True),                # malformed size: the parser says 400
])
def test_the_buffering_worker_hands_a_request_over_only_when_it_is_whole(buffer, whole):
    from loomapi.worker import complete

    assert complete(buffer, limit=1000) is whole


def test_chunk_data_that_looks_like_the_last_chunk_is_not_taken_for_it():
    from loomapi.worker import complete

    body = b"7\r\n\r\n0\r\n\r\n\r\n"  # a 7-byte chunk whose data is "\r\n0\r\n\r\n"
    assert complete(HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + body, limit=1000) is False
    assert complete(HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + body + b"0\r\n\r\n", limit=1000) is True


def test_aggregate_states_the_api_cannot_guard_are_deploy_check_warnings(settings, monkeypatch):
    """refuse_aggregate_namespace skips a state with prefix '' and cannot see a state that the API process
    does not import (not under LOOM_AGGREGATE_MODULES): both were silent before."""
    from django.core.checks import run_checks

    from journal.aggregates import declarations

    monkeypatch.setattr(declarations, "_states", {})

    class Bare(BaseModel):
        n: int = 0

    State("tests.api_safety.Bare", Bare, prefix="")
    settings.LOOM_AGGREGATE_MODULES = []
    found = {m.id for m in run_checks(include_deployment_checks=True) if (m.id or "").startswith("loom.W20")}
    assert {"loom.W204", "loom.W205"} <= found, found
    settings.LOOM_AGGREGATE_MODULES = ["tests.api.test_api_safety"]
    found = {m.id for m in run_checks(include_deployment_checks=True) if (m.id or "").startswith("loom.W20")}
    assert "loom.W205" not in found and "loom.W204" in found


class CountingBuffer(bytearray):
    """A buffer that counts the bytes its searches walk over (what framing a request costs)."""

    walked = 0

    def find(self, sub, start=0, *rest):
        found = super().find(sub, start, *rest)
        CountingBuffer.walked += (found if found >= 0 else len(self)) + len(sub) - start
        return found


def test_framing_a_request_read_a_few_bytes_at_a_time_walks_it_a_bounded_number_of_times():
    """The buffer used to be re-walked from its first chunk on every read: quadratic in the chunks."""
    from loomapi.framing import RequestFramer, Verdict

    wire = HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + b"1;x=y\r\na\r\n" * 5000 + b"0\r\nX-T: 1\r\n\r\n"
    framer, buffer = RequestFramer(1 << 20), CountingBuffer()
    CountingBuffer.walked = 0
    verdicts = []
    for i in range(0, len(wire), 3):
        buffer += wire[i:i + 3]
        verdicts.append(framer.advance(buffer))
    assert verdicts[-1] is Verdict.WHOLE and set(verdicts[:-1]) == {Verdict.MORE}
    assert CountingBuffer.walked < 4 * len(wire)


@pytest.mark.parametrize(("tail", "verdict"), [
    (b"1\r\na\r\n0\r\n" + b"X-T: " + b"t" * 40000 + b"\r\n", "too_large"),      # trailer section over 32 KiB
    (b"1\r\na\r\n0\r\n" + b"X-T: " + b"t" * 40000, "too_large"),               # ... even before its CRLF
    (b"1;" + b"e" * 9000, "malformed"),                                       # chunk-size line over 8190
    (b"1\r\nab\r\n", "malformed"),                                             # data not ended by CRLF
    (b"100000\r\n", "too_large"),                                              # one chunk over the limit
    (b"1\r\na\r\n" * 30000, "too_large"),                                       # framing over limit + 64 KiB
])
def test_chunked_framing_past_its_bounds_is_refused(tail, verdict):
    from loomapi.framing import RequestFramer

    framer = RequestFramer(1000)
    buffer = bytearray(HEAD + b"Transfer-Encoding: chunked\r\n\r\n")
    for i in range(0, len(tail), 4096):
        buffer += tail[i:i + 4096]
        result = framer.advance(buffer)
        if result.value != "more":
            break
    assert result.value == verdict and framer.problem


@hsettings(max_examples=200, deadline=None)
@given(chunks=st.lists(st.binary(min_size=1, max_size=40), max_size=12),
       extensions=st.lists(st.sampled_from([b"", b";a=1", b";name", b';q="x y"']), min_size=12, max_size=12),
       trailer=st.sampled_from([b"", b"X-T: 1\r\n", b"A: 1\r\nB: 2\r\n"]),
       cuts=st.lists(st.integers(1, 64), max_size=30), tail=st.binary(max_size=30))
def test_framing_is_the_same_however_the_reads_split_the_request(chunks, extensions, trailer, cuts, tail):
    """A chunked request fed in reads of any sizes is framed like the same bytes in one read: whole exactly
    at its end; and bytes after a malformed point never raise, they are one of the verdicts."""
    from loomapi.framing import RequestFramer, Verdict

    body = b"".join(b"%x%s\r\n%s\r\n" % (len(c), e, c) for c, e in zip(chunks, extensions, strict=False))
    wire = HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + body + b"0\r\n" + trailer + b"\r\n"
    assert RequestFramer(1 << 20).advance(wire) is Verdict.WHOLE
    framer, buffer, at, verdict = RequestFramer(1 << 20), bytearray(), 0, Verdict.MORE
    for cut in [*cuts, len(wire)]:
        buffer += wire[at:at + cut]
        at += cut
        verdict = framer.advance(buffer)
        if at < len(wire):
            assert verdict is Verdict.MORE, (at, len(wire))
        if at >= len(wire):
            break
    assert verdict is Verdict.WHOLE
    garbled = RequestFramer(1000).advance(HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + tail)
    assert isinstance(garbled, Verdict)
