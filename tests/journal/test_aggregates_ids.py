"""An aggregate id that is not a non-empty str (None, a number, bytes, a list) is refused with our named error
and nothing is written (issue #35: `do(action, None, ...)` wrote the stream `<Prefix>-None`, and
`do(action, 42)` the stream of "42"). Property tests on whatever database the suite runs on (SQLite and
PostgreSQL in CI)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.domains import counter as counter_domain
from journal.aggregates import do, do_with_retry, load
from journal.exceptions import InvalidStream
from journal.ids import id_problem
from journal.models import Event

pytestmark = pytest.mark.django_db

_counter = counter_domain.declare("IdCounter")
counter, increment = _counter.state, _counter.increment
PROPERTY = settings(max_examples=60, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
not_strings = st.one_of(st.none(), st.integers(), st.floats(allow_nan=False), st.booleans(), st.binary(max_size=8),
                        st.lists(st.integers(), max_size=2), st.just(""))


@PROPERTY
@given(id=not_strings)
def test_an_id_that_is_not_a_non_empty_str_is_refused_and_writes_nothing(id):
    before = Event.objects.count()
    for call in (lambda: do(increment, id, {"by": 1}), lambda: do_with_retry(increment, id, {"by": 1}),
                 lambda: load(counter, id)):
        with pytest.raises(InvalidStream, match="IdCounter"):
            call()
    assert Event.objects.count() == before
    assert not Event.objects.filter(stream_id__in=[counter.stream(str(id)), counter.stream(repr(id))]).exists()


@PROPERTY
@given(id=st.text(min_size=1, max_size=30))
def test_a_str_id_writes_its_own_stream_or_is_refused_by_the_alphabet(id):
    before = Event.objects.count()
    try:
        agg = do(increment, id, {"by": 1})
    except InvalidStream:
        assert id_problem(counter.stream(id)) is not None, id
        assert Event.objects.count() == before
        return
    assert agg.stream == counter.stream(id) and Event.objects.filter(stream_id=agg.stream).exists()
