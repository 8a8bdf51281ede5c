"""Stored = given: a property test of the JSON boundary (journal/jsonvalues.py) on the real database.

For any value hypothesis makes up, an append either refuses it with InvalidPayload and writes nothing,
or stores it and reads back exactly the documented normal form of it: same types (an int stays an
int, a float a float, bit for bit), same values, on SQLite and on PostgreSQL alike.
"""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from journal.envelopes import Envelope
from journal.exceptions import InvalidPayload
from journal.models import Event, Snapshot

pytestmark = pytest.mark.django_db

# Values close to what applications send, plus everything the boundary must refuse or normalise:
# floats of every magnitude (NaN and the infinities included), ints beyond 64 bits, -0.0, tuples,
# keys that are not strings, NUL, lone surrogates, and text that merely looks like an escape.
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(),
    st.sampled_from([4.205453796612399e16, 1e300, -0.0, 5e-324, 1.7976931348623157e308, 1e16, 1e-7, 0.1]),
    st.text(),
    st.text(alphabet=st.sampled_from(["\\", "u", "0", "\x00", "\ud800", "e", "+", "-", '"', "é", "\u2028"])),
)
keys = st.one_of(st.text(max_size=8), st.text(alphabet="\\u0\x00\udc00ab", max_size=6),
                 st.integers(-3, 3), st.none(), st.booleans())
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.tuples(inner, inner),
        st.dictionaries(keys, inner, max_size=5),
    ),
    max_leaves=25,
)

_streams = itertools.count()


def normal_form(value):
    """What the journal documents it gives back for `value`: tuples as lists, -0.0 as 0.0."""
    if isinstance(value, dict):
        return {k: normal_form(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [normal_form(v) for v in value]
    if isinstance(value, float) and value == 0.0:
        return 0.0
    return value


def same(a, b) -> bool:
    """Equal with the same types all the way down (1 != 1.0 != True here), floats bit for bit."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    return a == b


def rows() -> tuple[int, int]:
    return Event.objects.count(), Snapshot.objects.count()


@settings(max_examples=300, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(value=values)
def test_a_payload_is_refused_with_our_error_or_read_back_as_given(value):
    stream = f"rt-{next(_streams)}"
    before = rows()
    try:
        Event.objects.append(stream, Envelope("Value", value))
    except InvalidPayload:
        assert rows() == before
        with pytest.raises(InvalidPayload):
            Snapshot.objects.save_state(stream, 0, value)
        assert rows() == before
        return
    stored = Event.objects.read(stream)[0].payload
    assert same(stored, normal_form(value)), (value, stored)
    Snapshot.objects.save_state(stream, 0, value)
    assert same(Snapshot.objects.latest(stream).state, normal_form(value))


@pytest.mark.parametrize(
    "value",
    [4.205453796612399e16, 1e300, 1e16, -1.5e20, 1.7976931348623157e308, 5e-324, 1e-7, 2.5, 10**30, -(2**63),
     2**64, -0.0],
    ids=repr,
)
def test_numbers_keep_their_type_and_value(value):
    """The cases jsonb used to change: floats with a positive exponent came back as ints."""
    stream = f"num-{next(_streams)}"
    Event.objects.append(stream, Envelope("Number", {"x": value, "in": [value]}))
    got = Event.objects.read(stream)[0].payload
    assert same(got, normal_form({"x": value, "in": [value]})), got


def test_keys_that_are_not_strings_are_refused_not_turned_into_strings():
    before = rows()
    for payload in ({1: "a"}, {"x": [{2.5: 1}]}, {True: 1}, {None: 1}):
        with pytest.raises(InvalidPayload, match="key that is not a string"):
            Event.objects.append("keys", Envelope("Keys", payload))
    assert rows() == before


def test_the_deepest_allowed_nesting_reads_back_and_one_more_level_is_refused():
    """MAX_DEPTH (100) lists or objects deep is stored and read back on both backends; 101 is refused."""
    deepest: object = "leaf"
    for level in range(100):
        deepest = [deepest] if level % 2 else {"k": deepest}
    Event.objects.append("deep", Envelope("Deep", deepest))
    assert Event.objects.read("deep")[0].payload == deepest
    before = rows()
    with pytest.raises(InvalidPayload, match="nested deeper than 100"):
        Event.objects.append("deep", Envelope("Deep", [deepest]))
    assert rows() == before
