"""Transient calls: the same flow in-process, no journal, zero rows written.

The fast path for callers who do not need durability. Only our own overhead counts here, so the
path is a registry lookup, input validation when the flow declares a model, a context object and
the call (docs/bench-flows.md has the figure). The input is not JSON-checked: nothing is stored.
"""

from __future__ import annotations

import inspect
from typing import Any

from journal.flows.context import TransientContext, _error_text
from journal.flows.errors import NeedsDurable
from journal.flows.outcome import Outcome
from journal.flows.registry import _NEWEST, Flow, get_flow


def invoke_transient(flow: str | Flow, input: Any) -> Outcome:
    """Run `flow` on `input` here and now; Outcome(None, completed|failed, result, error)."""
    definition = _NEWEST.get(flow) if type(flow) is str else None
    if definition is None:
        definition = get_flow(flow)
    if inspect.iscoroutinefunction(definition.fn):
        raise NeedsDurable(f"flow {definition.name!r} is an async flow: start() it (invoke_transient runs sync "
                           f"flows only)")
    if definition.input_model is not None:
        input = definition.prepare(input, check_json=False)[0]
    try:
        result = definition.fn(TransientContext(definition.retry), input)
    except Exception as exc:
        return Outcome(None, "failed", None, _error_text(exc))
    return Outcome(None, "completed", result, None)
