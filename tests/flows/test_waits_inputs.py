"""Bad input to the primitives of flows that wait gets one of our named errors, and writes nothing.

Property tests (hypothesis) on whatever database the suite runs on (SQLite and PostgreSQL in CI):
messages to unknown or finished executions, payloads that are not JSON, bad topics and message ids,
negative / NaN / non-numeric sleeps and delays, naive datetimes, bad event keys and timeouts, forks
from steps that do not exist. "Nothing written" is checked on every table the waits touch.
"""

from __future__ import annotations

import itertools
import math
from datetime import datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from journal.exceptions import JournalError
from journal.flows import InvalidInput, NotResumable, UnknownExecution, flow, ownership, start
from journal.ids import id_problem
from journal.models import Event, Execution, Fence
from tests.fixtures import edge_waits_flows
from tests.journal.test_inputs_roundtrip import normal_form, same, values

pytestmark = pytest.mark.django_db

PROPERTY = settings(max_examples=60, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
_ids = itertools.count()
BAD = {"value": None}  # the bad argument the next run of edge.bad_* passes (it cannot travel as JSON input)


@pytest.fixture(autouse=True)
def _settings(settings):
    settings.LOOM_WAIT_INLINE_MAX = 0.0
    settings.LOOM_FLOW_MODULES = ["tests.fixtures.edge_waits_flows"]
    edge_waits_flows.create_effects_table()
    installed = ownership.get_ownership()
    ownership.set_ownership(None)  # no lease keeper thread in the test process (it would outlive the test database)
    yield
    ownership.set_ownership(installed)


def rows() -> tuple[int, ...]:
    from journal.models import FlowEvent, Message, Wait

    return (Event.objects.count(), Execution.objects.count(), Fence.objects.count(), Wait.objects.count(),
            Message.objects.count(), FlowEvent.objects.count())


def waiting(prefix: str = "in") -> str:
    eid = f"{prefix}-{next(_ids)}"
    assert start("edge.receiver", {"topic": "go"}, execution_id=eid).status == "waiting"
    return eid


@flow("edge.bad_sleep")
def bad_sleep(ctx, value):
    """Calls ctx.sleep with BAD["value"]; returns the name of the error it raised (or "slept")."""
    try:
        ctx.sleep(BAD["value"])
    except InvalidInput as exc:
        return f"InvalidInput: {exc}"
    return "slept"


@flow("edge.bad_sleep_until")
def bad_sleep_until(ctx, value):
    try:
        ctx.sleep_until(BAD["value"])
    except InvalidInput as exc:
        return f"InvalidInput: {exc}"
    return "slept"


@flow("edge.bad_recv")
def bad_recv(ctx, value):
    try:
        ctx.recv(BAD["value"])
    except InvalidInput as exc:
        return f"InvalidInput: {exc}"
    return "received"


# -- messages ------------------------------------------------------------------------------------------------
@PROPERTY
@given(payload=values)
def test_a_payload_is_refused_with_our_error_or_kept_as_given(payload):
    from journal.flows import send
    from journal.models import Message

    eid = waiting()
    before = rows()
    try:
        message_id = send(eid, "other", payload)
    except InvalidInput:
        assert rows() == before
        return
    kept = Message.objects.get(execution_id=eid, message_id=message_id).payload
    assert same(kept, normal_form(payload)), (payload, kept)


names = st.one_of(st.text(max_size=220), st.integers(), st.none(), st.booleans(), st.just(""),
                  st.just("t" * 201), st.text(alphabet="\x00\ud800a", min_size=1, max_size=4))


@PROPERTY
@given(topic=names, message_id=names)
def test_topics_and_message_ids_are_checked_before_anything_is_written(topic, message_id):
    from journal.flows import send

    eid = waiting()
    before = rows()
    def good(v) -> bool:  # a new topic or message id is in the id alphabet (#25: no newline, no ANSI escape)
        return id_problem(v) is None

    try:
        send(eid, topic, {"ok": 1}, message_id=message_id)
    except InvalidInput:
        assert rows() == before
        assert not (good(topic) and (message_id is None or good(message_id))), (topic, message_id)
        return
    assert good(topic) and (message_id is None or good(message_id)), (topic, message_id)
    assert rows()[4] == before[4] + 1


@PROPERTY
@given(topic=st.one_of(st.text(alphabet="ab\n\r\x1b[31m \t\u200b\u202e", min_size=1, max_size=12),
                       st.sampled_from(["x\nINFO forged line", "\x1b[2J\x1b[31mred", "a b", "..", "ok/../x"])))
def test_a_topic_with_newlines_or_escapes_is_refused_before_anything_is_written(topic):
    """#25 (log injection): a topic is logged (the API's "message ... (topic ...) sent" line) and shown in the
    admin; one with a newline or an ANSI escape forged log lines. Topics are ids: our error, nothing written."""
    from journal.flows import send

    eid = waiting()
    before = rows()
    if id_problem(topic) is None:
        send(eid, topic, 1)
        assert rows()[4] == before[4] + 1
        return
    with pytest.raises(InvalidInput, match="topic"):
        send(eid, topic, 1)
    with pytest.raises(InvalidInput, match="message_id"):
        send(eid, "go", 1, message_id=topic)
    assert rows() == before
    BAD["value"] = topic  # a new recv on it: nobody could send to it, refused as well
    assert start("edge.bad_recv", {}, execution_id=f"badrecv-{next(_ids)}").result.startswith("InvalidInput")


@PROPERTY
@given(execution_id=st.text(min_size=1, max_size=60))
def test_every_verb_on_an_unknown_execution_is_refused_with_our_error(execution_id):
    from journal import flows

    before = rows()
    calls = [lambda: flows.send(execution_id, "t", 1), lambda: flows.wake_now(execution_id),
             lambda: flows.suspend(execution_id), lambda: flows.get_event(execution_id, "k"),
             lambda: flows.fork(execution_id, 0)]
    for call in calls:
        with pytest.raises(JournalError) as caught:
            call()
        if id_problem(execution_id) is None:
            assert isinstance(caught.value, UnknownExecution), caught.value
    assert rows() == before


@pytest.mark.parametrize("how", ["completed", "failed", "cancelled"])
def test_a_message_to_a_finished_execution_is_refused_and_writes_nothing(how):
    from journal import flows
    from journal.flows.errors import ExecutionFinished

    if how == "completed":
        eid = "fin-c"
        assert start("edge.steps", {"n": 1}, execution_id=eid).status == "completed"
    elif how == "failed":
        eid = "fin-f"
        assert start("edge.steps", {}, execution_id=eid).status == "failed"  # no "n": a KeyError
    else:
        eid = waiting("fin")
        flows.cancel(eid, "test")
    before = rows()
    with pytest.raises(ExecutionFinished) as caught:
        flows.send(eid, "go", {"late": True}, message_id="late-1")
    assert caught.value.execution_id == eid and eid in str(caught.value)
    with pytest.raises(NotResumable):  # (ExecutionFinished is one)
        flows.suspend(eid)
    assert rows() == before


# -- sleeps, delays, deadlines --------------------------------------------------------------------------------
bad_seconds = st.one_of(st.floats(max_value=-1e-9), st.just(math.nan), st.just(math.inf), st.just(-math.inf),
                        st.text(max_size=5), st.none(), st.lists(st.integers(), max_size=2))


@PROPERTY
@given(seconds=bad_seconds)
def test_a_bad_sleep_raises_invalid_input_in_the_flow_and_parks_nothing(seconds):
    from journal.models import Wait

    BAD["value"] = seconds
    eid = f"bs-{next(_ids)}"
    out = start("edge.bad_sleep", {}, execution_id=eid)
    assert out.status == "completed" and str(out.result).startswith("InvalidInput"), out
    assert not Wait.objects.filter(execution_id=eid).exists()
    assert "WAIT_STARTED" not in [e.type for e in Event.objects.read(eid)]


@PROPERTY
@given(when=st.one_of(st.datetimes(), st.text(max_size=10), st.floats(), st.none()))
def test_sleep_until_refuses_naive_datetimes_and_non_datetimes(when):
    from journal.models import Wait

    BAD["value"] = when
    eid = f"bu-{next(_ids)}"
    out = start("edge.bad_sleep_until", {}, execution_id=eid)
    assert str(out.result).startswith("InvalidInput"), out
    assert not Wait.objects.filter(execution_id=eid).exists()


@PROPERTY
@given(topic=st.one_of(st.integers(), st.none(), st.just(""), st.just("t" * 201)))
def test_recv_refuses_a_bad_topic_without_waiting(topic):
    from journal.models import Wait

    BAD["value"] = topic
    eid = f"br-{next(_ids)}"
    out = start("edge.bad_recv", {}, execution_id=eid)
    assert str(out.result).startswith("InvalidInput"), out
    assert not Wait.objects.filter(execution_id=eid).exists()


@PROPERTY
@given(delay=bad_seconds.filter(lambda v: v is not None))  # (None: no delay)
def test_a_start_with_a_bad_delay_is_refused_and_writes_nothing(delay):
    before = rows()
    with pytest.raises(InvalidInput):
        start("edge.steps", {"n": 1}, execution_id=f"bd-{next(_ids)}", delay=delay)
    assert rows() == before


def test_start_at_must_be_aware_and_not_given_with_delay():
    from django.utils import timezone

    before = rows()
    with pytest.raises(InvalidInput):
        start("edge.steps", {"n": 1}, execution_id="sa-naive", start_at=datetime(2030, 1, 1))
    with pytest.raises(InvalidInput):
        start("edge.steps", {"n": 1}, execution_id="sa-both", start_at=timezone.now() + timedelta(hours=1),
              delay=5)
    with pytest.raises(InvalidInput):
        start("edge.steps", {"n": 1}, execution_id="sa-text", start_at="tomorrow")
    assert rows() == before


# -- events and forks --------------------------------------------------------------------------------------
bad_keys = st.one_of(st.integers(), st.none(), st.just(""), st.just("k" * 201))
bad_timeouts = st.one_of(st.floats(max_value=-1e-9), st.just(math.nan), st.text(max_size=3))


@PROPERTY
@given(case=st.one_of(st.tuples(bad_keys, st.none()), st.tuples(st.just("good-key"), bad_timeouts)))
def test_get_event_refuses_bad_keys_and_timeouts(case):
    from journal.flows import get_event

    key, timeout = case
    eid = waiting("ev")
    before = rows()
    with pytest.raises(InvalidInput):
        get_event(eid, key, timeout=timeout)
    assert rows() == before


@PROPERTY
@given(from_step=st.one_of(st.integers(max_value=-1), st.integers(min_value=4), st.floats(), st.text(max_size=3),
                           st.none()))
def test_a_fork_from_a_step_that_does_not_exist_is_refused(from_step):
    from journal.flows import fork

    eid = f"fk-{next(_ids)}"
    assert start("edge.steps", {"n": 3}, execution_id=eid).status == "completed"
    before = rows()
    with pytest.raises(InvalidInput):
        fork(eid, from_step)
    assert rows() == before
