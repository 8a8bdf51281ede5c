"""Durable flows: plain Python steps, journaled, resumable after a crash; or called transiently.

    from journal.flows import flow, start, resume, invoke_transient

    @flow("calc.add")
    def add(ctx, input):
        return ctx.step("add", lambda: input["a"] + input["b"])

    start("calc.add", {"a": 1, "b": 2})          # durable: 4 events, returns Outcome
    invoke_transient("calc.add", {"a": 1, "b": 2})  # writes nothing

Modules: registry (defining), context (what flow code calls), runtime (start/resume/retry/cancel),
handover (queue a resume for a worker). `retry_execution` is runtime.retry (journal.flows.retry is
the retry-policy module),
writer (the one write point), state (fold, snapshots, bounded load), ownership (lease hook),
transient, describe, events (the event shape), errors, waits (timers, messages, events, children,
suspend, continue-as-new, fork: flows that wait). See docs/flows.md.

Names that need the database (start, resume, cancel, describe, ...) load on first use, so a
module may define flows before Django's app registry is ready.
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING

from journal.flows.context import Context
from journal.flows.errors import (
    ChildFailed,
    DeadlineExceeded,
    ExecutionBusy,
    ExecutionExists,
    ExecutionFinished,
    FlowError,
    InvalidInput,
    NeedsDurable,
    NonDeterminism,
    NonRetryableError,
    NotResumable,
    OwnershipLost,
    ShuttingDown,
    StepFailed,
    UnknownExecution,
    UnknownFlow,
)
from journal.flows.outcome import Outcome
from journal.flows.registry import Flow, flow, get_flow
from journal.flows.retry import RetryPolicy
from journal.flows.state import TERMINAL
from journal.flows.transient import invoke_transient

if TYPE_CHECKING:
    from journal.flows.describe import describe
    from journal.flows.handover import hand_over
    from journal.flows.runtime import (
        cancel,
        outcome_of,
        resume,
        retry_execution,
        start,
        suspend,
        unseal_started,
        wake_due,
    )
    from journal.flows.state import load_state
    from journal.flows.waits import fork, get_event, pending_messages, send, waiting_on, wake_now
    from journal.flows.writer import header_status

_LAZY = {
    "start": "journal.flows.runtime", "resume": "journal.flows.runtime", "cancel": "journal.flows.runtime",
    "outcome_of": "journal.flows.runtime", "describe": "journal.flows.describe",
    "retry_execution": "journal.flows.runtime", "suspend": "journal.flows.runtime", "wake_due": "journal.flows.runtime",
    "hand_over": "journal.flows.handover", "unseal_started": "journal.flows.runtime",
    "header_status": "journal.flows.writer",  # (status, flow, result, error) of a header, or None: the other apps' look
    "load_state": "journal.flows.state",
    **{name: "journal.flows.aio" for name in ("astart", "aresume", "acancel", "asend", "aget_event", "adescribe",
                                              "aoutcome_of")},
    **{name: "journal.flows.waits" for name in ("send", "get_event", "wake_now", "waiting_on", "pending_messages",
                                                "fork")},
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'journal.flows' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


class _Face(types.ModuleType):
    """`describe` is both a submodule of this package and the face's function. Importing the submodule
    (`from journal.flows.describe import ...`) makes importlib bind it on the package; before any caller had
    asked for the function, that bound the module in its place and `from journal.flows import describe` then
    gave a module ("'module' object is not callable", an order-dependent failure). The binding keeps the
    function."""

    def __setattr__(self, name: str, value) -> None:
        if name in _LAZY and isinstance(value, types.ModuleType) and hasattr(value, name):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Face


__all__ = [
    "TERMINAL", "ChildFailed", "Context", "DeadlineExceeded", "ExecutionBusy", "ExecutionExists", "ExecutionFinished",
    "Flow", "FlowError", "InvalidInput", "NeedsDurable", "NonDeterminism", "NonRetryableError", "NotResumable",
    "Outcome", "OwnershipLost", "RetryPolicy", "ShuttingDown", "StepFailed", "UnknownExecution", "UnknownFlow",
    "acancel", "adescribe", "aget_event", "aoutcome_of", "aresume", "asend", "astart", "cancel", "describe", "flow",
    "fork", "get_event", "get_flow", "hand_over", "header_status", "invoke_transient", "load_state", "outcome_of",
    "pending_messages", "resume", "retry_execution", "send", "start", "suspend", "unseal_started", "waiting_on",
    "wake_due", "wake_now",
]
