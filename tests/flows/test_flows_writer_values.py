"""What a batch of bootstraps and settles stores reads back exactly as given, on both databases.

On PostgreSQL BOOT_MANY and SETTLE_MANY send their array parameters in binary (issue 33: the coalescer's
durable batches no longer quote each JSON input and result in Python); any value the journal's JSON rules
accept must come back equal from the header and from the events, whatever characters it holds.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from journal import jsonvalues
from journal.envelopes import AppendItem, Envelope
from journal.flows import ownership as own
from journal.models import Event, Execution
from journal.store import store_for
from journal.store.base import ExecutionBoot, ExecutionSettle

pytestmark = pytest.mark.django_db(transaction=True)

_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | _text
values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
                      max_leaves=8)
_ids = itertools.count()


@pytest.fixture(autouse=True)
def _no_ownership():
    """The store's statements alone (no lease companion CTEs)."""
    installed = own.get_ownership()
    own.set_ownership(None)
    yield
    own.set_ownership(installed)


def _boot(execution_id: str, value) -> ExecutionBoot:
    item = AppendItem.build(execution_id, [Envelope("EXECUTION_STARTED", {"flow": "test.chain", "input": value}),
                                           Envelope("STEP_STARTED", {"step": "s0", "pos": 0})])
    return ExecutionBoot(item, store_for().encode([item])[0], "test.chain", "running", jsonvalues.dumps(value),
                         None, "", False)


def _settle(execution_id: str, value) -> ExecutionSettle:
    item = AppendItem.build(execution_id, [Envelope("EXECUTION_COMPLETED", {"result": value})], 1, 1)
    return ExecutionSettle(item, store_for().encode([item])[0], "completed", jsonvalues.dumps(value), "")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(values, values), min_size=2, max_size=4))
def test_a_batch_reads_back_every_input_and_result_as_given(pairs):
    ids = [f"wv-{next(_ids)}" for _ in pairs]
    store = store_for()
    started = store.bootstrap_many([_boot(eid, value) for eid, (value, _) in zip(ids, pairs, strict=True)])
    assert started == [1] * len(ids)
    store.settle_many([_settle(eid, result) for eid, (_, result) in zip(ids, pairs, strict=True)])
    for eid, (value, result) in zip(ids, pairs, strict=True):
        header = Execution.objects.get(pk=eid)
        assert (header.status, header.input, header.result) == ("completed", value, result)
        events = list(Event.objects.read(eid))
        assert [e.seq for e in events] == [0, 1, 2]
        assert events[0].payload["input"] == value and events[2].payload["result"] == result
