"""Bad input at every public entry of the journal gets one of our named errors, with the database unchanged.

Each case here escaped as a raw error before (UnicodeEncodeError, DataError, ProgrammingError,
RecursionError) or was stored although the rules refuse it. The same cases run on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from journal import jsonvalues
from journal.aggregates import State, do, do_with_retry, load
from journal.envelopes import AppendItem, Envelope
from journal.exceptions import InvalidGuard, InvalidPayload, InvalidStream, JournalError
from journal.flows import flow, outcome_of, start
from journal.flows.errors import ExecutionExists, InvalidInput, UnknownExecution
from journal.ids import MAX_ID_LENGTH, check_id
from journal.models import Event, Execution, Fence, Snapshot

pytestmark = pytest.mark.django_db


class Tally(BaseModel):
    n: int = 0


class Bumped(BaseModel):
    by: int = 1


class Bump(BaseModel):
    by: int = 1


tally = State("TestInputTally", Tally)


@tally.on(Bumped)
def _bumped(state: Tally, e: Bumped) -> dict:
    return {"n": state.n + e.by}


@tally.action(Bump)
def bump(state: Tally, cmd: Bump):
    return Bumped(by=cmd.by)


@pytest.fixture(autouse=True)
def _flows(settings):
    settings.LOOM_FLOW_MODULES = ["tests.fixtures.flows_fixtures"]
    import tests.fixtures.flows_fixtures  # noqa: F401  (registers test.add)


def counts() -> tuple[int, int, int, int]:
    return Event.objects.count(), Fence.objects.count(), Snapshot.objects.count(), Execution.objects.count()


@pytest.fixture
def unchanged():
    """The database holds one known stream before the case and exactly that after it."""
    Event.objects.open_stream("known", Envelope("Opened"))
    before = counts()
    yield
    assert counts() == before


# -- the id alphabet: one rule for stream ids, execution ids and aggregate streams --------------------------
BAD_IDS = [
    "", "x" * (MAX_ID_LENGTH + 1), "has space", "tab\there", "abc\n", "nul\x00", "lone\ud800surrogate",
    "..", ".", "../../admin", "a/../b", "a\\..\\b", "%2e%2e/admin", "a/%2E%2e", "bidi\u202eevil",
    "zero\u200bwidth", "\ufeffbom", "c1\x85control", "csi\x9b", "nbsp\xa0", "line\u2028sep", "private\ue000",
    None, 7, b"bytes",
]
GOOD_IDS = ["order-42", "Ticket:42", "a/b", "a.b", "..a", "a..", "x%41", "ü-1", "日本", "emoji-\U0001f600",
            "x" * MAX_ID_LENGTH]


UNSTORABLE_IDS = ["", "x" * (MAX_ID_LENGTH + 1), "nul\x00", "lone\ud800surrogate", None, 7, b"bytes"]
"""Ids the database cannot hold: refused by every call, reads included (journal/ids.py check_stored_id)."""


@pytest.mark.parametrize("bad", BAD_IDS, ids=ascii)
def test_a_stream_id_outside_the_alphabet_is_refused_where_a_stream_is_created(bad, unchanged):
    """Append and batch without a guard (they may create the stream), append at expected_seq -1, and
    open_stream all refuse it with InvalidStream."""
    calls = [
        lambda: Event.objects.append(bad, Envelope("E")),
        lambda: Event.objects.append(bad, Envelope("E"), expected_seq=-1),
        lambda: Event.objects.append_batch([(bad, [Envelope("E")])]),
        lambda: Event.objects.append_batch([AppendItem(bad, (Envelope("E"),))]),
        lambda: Event.objects.open_stream(bad, Envelope("E")),
    ]
    for call in calls:
        with pytest.raises(InvalidStream):
            call()


@pytest.mark.parametrize("bad", UNSTORABLE_IDS, ids=ascii)
def test_an_id_the_database_cannot_hold_is_refused_everywhere(bad, unchanged):
    """Guarded appends, read, tip, fence and snapshot calls refuse it with InvalidStream too."""
    calls = [
        lambda: Event.objects.append(bad, Envelope("E"), expected_seq=0),
        lambda: Event.objects.append(bad, Envelope("E"), fence_token=1),
        lambda: Event.objects.read(bad),
        lambda: Event.objects.tip(bad),
        lambda: Fence.objects.advance(bad),
        lambda: Fence.objects.current(bad),
        lambda: Snapshot.objects.save_state(bad, 0, {}),
        lambda: Snapshot.objects.latest(bad),
    ]
    for call in calls:
        with pytest.raises(InvalidStream):
            call()


@pytest.mark.parametrize("bad", [b for b in BAD_IDS if isinstance(b, str) and b], ids=ascii)
def test_an_execution_id_outside_the_alphabet_is_refused_before_anything_is_written(bad, unchanged):
    with pytest.raises(InvalidInput, match="invalid stream id"):
        start("test.add", {"a": 1, "b": 2}, execution_id=bad)


@pytest.mark.parametrize("name", ["resume", "cancel", "outcome_of", "describe", "hand_over", "retry_execution"])
@pytest.mark.parametrize("bad", ["nul\x00", "lone\ud800", "", "x" * (MAX_ID_LENGTH + 1)], ids=ascii)
def test_operating_on_an_execution_id_the_database_cannot_hold_is_invalid_stream(name, bad, unchanged):
    """Every public operation on an execution checks its id before reading anything (a NUL was a
    DataError and a lone surrogate a UnicodeEncodeError on PostgreSQL)."""
    from journal import flows

    with pytest.raises(InvalidStream):
        getattr(flows, name)(bad)


@pytest.mark.parametrize("name", ["resume", "cancel", "describe", "hand_over", "retry_execution"])
def test_operating_on_an_unknown_id_outside_the_alphabet_is_unknown_execution(name, unchanged):
    """A storable id outside the alphabet may name an execution stored before it: looked up, not refused."""
    from journal import flows

    with pytest.raises(UnknownExecution):
        getattr(flows, name)("../x")


@pytest.mark.parametrize("bad", ["nul\x00", "lone\ud800", "../../admin", "bidi\u202e", "abc\n", "y" * 200],
                         ids=ascii)
def test_an_aggregate_id_outside_the_alphabet_is_refused_by_do_and_retry(bad, unchanged):
    """The stream of an aggregate (prefix + id) is checked when its first event is appended, so the
    prefix counts toward the length; load refuses only what the database cannot hold (an aggregate
    stored before the alphabet still loads)."""
    for call in (lambda: do(bump, bad, {}), lambda: do_with_retry(bump, bad, {})):
        with pytest.raises(InvalidStream):
            call()
    if "\x00" in bad or "\ud800" in bad or len(bad) > 150:
        with pytest.raises(InvalidStream):
            load(tally, bad)
    else:
        assert load(tally, bad).version == -1


@pytest.mark.parametrize("good", GOOD_IDS, ids=ascii)
def test_ids_inside_the_alphabet_are_stored_and_read_back(good):
    assert check_id(good) == good
    Event.objects.append(good, Envelope("E", {"id": good}))
    assert [(e.stream_id, e.payload) for e in Event.objects.read(good)] == [(good, {"id": good})]


# -- event types ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", ["abc\n", "Abc\n", "A\x00", "A\ud800", "A b"], ids=ascii)
def test_an_event_type_with_a_trailing_newline_or_a_control_character_is_refused(bad, unchanged):
    with pytest.raises(InvalidPayload, match="invalid event type"):
        Event.objects.append("known", Envelope(bad))


# -- guards ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [{"fence_token": 2**63}, {"expected_seq": 2**63}, {"fence_token": 10**30},
                                    {"expected_seq": True}, {"fence_token": 1.0}])
def test_a_guard_beyond_bigint_is_an_invalid_guard(kwargs, unchanged):
    with pytest.raises(InvalidGuard):
        Event.objects.append("known", Envelope("E"), **kwargs)
    with pytest.raises(InvalidGuard):
        Event.objects.append_batch([AppendItem("known", (Envelope("E"),), **kwargs)])


@pytest.mark.parametrize("token", ["", "1", 0, -1, 2**63, 1.5, True])
def test_advancing_a_fence_with_a_bad_expected_token_is_an_invalid_guard(token, unchanged):
    with pytest.raises(InvalidGuard):
        Fence.objects.advance("known", expected_token=token)


def test_advancing_a_fence_checks_the_stream_id(unchanged):
    for bad in ("a\x00", 123, ""):
        with pytest.raises(InvalidStream):
            Fence.objects.advance(bad)


def test_reads_check_their_bounds(unchanged):
    with pytest.raises(InvalidGuard):
        Event.objects.read("known", after_seq=2**63)
    with pytest.raises(InvalidGuard):
        Event.objects.read("known", limit=-1)


# -- payloads ---------------------------------------------------------------------------------------------------
def nested(depth: int):
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"x": "lone \ud800"}, "lone surrogate"),
        ({"lone \udfff": 1}, "lone surrogate"),
        ({"x": "a\x00b"}, "NUL"),
        ({"a\x00": 1}, "NUL"),
        ({"x": "\\\x00"}, "NUL"),
        ({1: "int key"}, "key that is not a string"),
        ({"x": {None: 1}}, "key that is not a string"),
        ({"x": float("inf")}, "not JSON-serialisable"),
        ({"x": 10**5000}, "not JSON-serialisable"),
        ({"x": nested(101)}, "nested deeper than 100"),
        ({"x": nested(50_000)}, "nested deeper than 100"),
    ],
    ids=["surrogate", "surrogate-key", "nul", "nul-key", "escaped-backslash-then-nul", "int-key", "none-key",
         "infinity", "int-over-4300-digits", "depth-101", "depth-50000"],
)
def test_unstorable_payloads_are_invalid_payload_and_nothing_is_written(payload, message, unchanged):
    with pytest.raises(InvalidPayload, match=message):
        Event.objects.append("known", [Envelope("Fine"), Envelope("Bad", payload)])
    with pytest.raises(InvalidPayload, match=message):
        Event.objects.append_batch([("other", [Envelope("Fine")]), ("known", [Envelope("Bad", payload)])])
    with pytest.raises(InvalidPayload, match=message):
        Snapshot.objects.save_state("known", 0, payload)


def test_the_six_characters_backslash_u0000_are_text_not_a_nul():
    """A payload holding a backslash followed by u0000 (no NUL) is stored and read back as given."""
    payload = {"text": "\\u0000", "also": "\\\\u0000", "key\\u0000": "x", "n": [r"\u0000"]}
    Event.objects.append("s", Envelope("Text", payload))
    assert Event.objects.read("s")[0].payload == payload


def test_a_payload_at_the_size_limit_is_stored_and_one_byte_more_is_refused(settings):
    """The limit counts UTF-8 bytes of the stored JSON text: 3-byte characters count 3."""
    settings.LOOM_MAX_PAYLOAD_BYTES = 4096
    overhead = len('{"x":""}')
    fits = {"x": "€" * ((4096 - overhead) // 3) + "a" * ((4096 - overhead) % 3)}
    Event.objects.append("big", Envelope("Big", fits))
    assert Event.objects.read("big")[0].payload == fits
    Event.objects.append("big", Envelope("Big", {"x": fits["x"][:-1]}))
    before = counts()
    with pytest.raises(InvalidPayload, match="over LOOM_MAX_PAYLOAD_BYTES"):
        Event.objects.append("big", Envelope("Big", {"x": fits["x"] + "a"}))
    assert counts() == before


# -- durable flows -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "value",
    [nested(5000), {"a": 1, "b": 2, "x": "\ud800"}, {"a": 1, "b": 2, "x": "\x00"}, {"a": 1, "b": 2, 3: 4}],
    ids=["deep", "surrogate", "nul", "int-key"],
)
def test_unstorable_flow_input_is_invalid_input_and_nothing_is_written(value, unchanged):
    with pytest.raises(InvalidInput):
        start("test.add", value, execution_id="in-1")


@flow("test.inputs.returns")
def _returns(ctx, value):
    return ctx.step("give", lambda: {1: "a"} if value["kind"] == "int-keys" else {"x": 4.205453796612399e16})


def test_a_step_result_the_journal_cannot_store_fails_the_step_not_the_run():
    """A step returning {1: "a"} would be stored as {"1": "a"} and replayed differently: the step fails
    with the reason, the execution settles as failed (before, the run stopped with a raw error, left running)."""
    outcome = start("test.inputs.returns", {"kind": "int-keys"}, execution_id="ret-1")
    assert outcome.status == "failed" and "key that is not a string" in outcome.error
    assert Execution.objects.get(id="ret-1").status == "failed"


def test_a_float_result_reads_back_as_the_same_float_from_the_log_and_the_header():
    outcome = start("test.inputs.returns", {"kind": "float"}, execution_id="ret-2")
    assert outcome.result == {"x": 4.205453796612399e16}
    again = outcome_of("ret-2").result["x"]
    assert type(again) is float and again == 4.205453796612399e16
    with pytest.raises(ExecutionExists) as exists:
        start("test.inputs.returns", {"kind": "float"}, execution_id="ret-2")
    assert type(exists.value.result["x"]) is float


def test_every_refusal_here_is_a_journal_error():
    """The named errors of this module share the journal's base class (one `except` catches them)."""
    assert issubclass(InvalidGuard, InvalidPayload) and issubclass(InvalidPayload, JournalError)
    assert issubclass(InvalidStream, JournalError) and issubclass(InvalidInput, JournalError)


# -- the JSON boundary's quick paths (large values skip the walk when their text proves it needless) ------
PAD = "p" * 5000  # past the size at which the text's bracket counts decide whether to walk


def _deep(levels: int, inner: object) -> object:
    for _ in range(levels):
        inner = [inner]
    return inner


@pytest.mark.parametrize("value", [
    {1: PAD}, {"a": PAD, None: 1}, [{"a": PAD, 2: 1}], {"a": [{3: PAD}]}, [PAD, {(1, 2): 3}],
    {**{f"k{i}": i for i in range(40)}, 7: PAD}, [*range(40), {"a": {8: PAD}}], _deep(101, PAD),
    {"a": _deep(100, PAD)}, {"{{{": _deep(101, 1), "x": PAD},
], ids=lambda v: ascii(v)[:40])
def test_large_values_get_the_same_refusals_as_small_ones(value):
    with pytest.raises(InvalidPayload):
        jsonvalues.dumps(value)


@pytest.mark.parametrize("value", [
    list(range(5000)), {f"k{i}": i for i in range(5000)}, {"a": PAD, "b": _deep(99, PAD)}, _deep(100, PAD),
    [{"id": i, "tags": ["a"], "m": {"x": 1.5}} for i in range(500)], {"{": PAD, "[[[": [1, [2]]},
], ids=lambda v: ascii(v)[:40])
def test_large_values_inside_the_rules_are_stored_as_json_writes_them(value):
    assert json.loads(jsonvalues.dumps(value)) == json.loads(json.dumps(value))
