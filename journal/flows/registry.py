"""Defining flows: `@flow(name, input_model=..., retry=...)` registers a plain function by name.

A flow is `fn(ctx, input) -> result`. Its input and result are JSON-serialisable (a pydantic
`input_model` validates the input; the flow then receives the model instance and the journal
keeps `model_dump(mode="json")`). The registry is per process: every process that starts or
resumes a flow must import its module (LOOM_FLOW_MODULES does that at start-up).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from typing import Any

from journal import jsonvalues
from journal.exceptions import InvalidPayload
from journal.flows.errors import InvalidInput, UnknownFlow
from journal.flows.retry import NO_RETRY, RetryPolicy

_REGISTRY: dict[str, Flow] = {}


@dataclass(frozen=True, slots=True)
class Flow:
    name: str
    fn: Callable[..., Any]
    input_model: type | None = None
    retry: RetryPolicy = NO_RETRY

    def prepare(self, value: Any, *, check_json: bool = True) -> tuple[Any, Any]:
        """(what the flow receives, what the journal stores); InvalidInput if it does not validate."""
        model = self.input_model
        if model is not None:
            from pydantic import ValidationError

            try:
                parsed = value if isinstance(value, model) else model.model_validate(value)
            except ValidationError as exc:
                raise InvalidInput(f"input of flow {self.name!r} does not validate: {exc}") from None
            return parsed, (parsed.model_dump(mode="json") if check_json else None)
        if check_json:  # the journal's JSON rules (journal/jsonvalues.py), so the start cannot fail later
            try:
                jsonvalues.dumps(value, f"input of flow {self.name!r}")
            except InvalidPayload as exc:
                raise InvalidInput(str(exc)) from None
        return value, value

    def __call__(self, ctx, value):
        return self.fn(ctx, value)


def flow(name: str | Callable | None = None, *, input_model: type | None = None,
         retry: RetryPolicy | None = None):
    """Register a flow: `@flow("calc.add")`, `@flow(name="calc.add", retry=RetryPolicy(3))` or bare `@flow`
    (named module.qualname). `retry` is the default policy of the flow's steps."""
    if callable(name):  # bare @flow
        return flow()(name)

    def register(fn: Callable) -> Flow:
        flow_name = name or f"{fn.__module__}.{fn.__qualname__}"
        if not isinstance(flow_name, str) or not flow_name or len(flow_name) > 200:
            raise ValueError(f"flow name must be a non-empty string of at most 200 characters, got {flow_name!r}")
        existing = _REGISTRY.get(flow_name)
        if existing is not None and (existing.fn.__module__, existing.fn.__qualname__) != (
                fn.__module__, fn.__qualname__):
            raise ValueError(f"flow {flow_name!r} is already registered by "
                             f"{existing.fn.__module__}.{existing.fn.__qualname__}")
        defined = Flow(flow_name, fn, input_model, retry or NO_RETRY)
        if input_model is not None:  # marked input fields (journal/privacy) are sealed in EXECUTION_STARTED
            from journal.privacy import marking

            marking.declare_model("EXECUTION_STARTED", input_model, ("input",), (("flow",), flow_name))
        _REGISTRY[flow_name] = defined
        return defined

    return register


def get_flow(name: str | Flow) -> Flow:
    """The flow registered under `name` (a Flow is returned as is); UnknownFlow otherwise."""
    if isinstance(name, Flow):
        return name
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise UnknownFlow(name) from None


INTERNAL_PREFIX = "loom."
"""Flows named so are Loom's own machinery (the Tasks backend's `loom.task` imports and calls a task by
path): started by Loom's code, never by a caller from outside unless LOOM_EXPOSED_INTERNAL_FLOWS names them."""


def is_internal(name: str) -> bool:
    return name.startswith(INTERNAL_PREFIX)


def exposed(name: str) -> bool:
    """May a caller from outside (an API token, the admin's schedule form) start or call flow `name`?
    Every flow but an internal one that LOOM_EXPOSED_INTERNAL_FLOWS does not name exactly."""
    from journal import conf

    return not is_internal(name) or name in conf.get("LOOM_EXPOSED_INTERNAL_FLOWS")


def registered() -> dict[str, Flow]:
    return dict(_REGISTRY)


def flow_module_problems(modules: list[str]) -> list[str]:
    """Import each module of LOOM_FLOW_MODULES (registering its flows); why each one that failed did.

    Called from the journal's ready() and its system check loom.E003: a typo in the setting is reported
    with the check's id when a command starts, instead of a raw ModuleNotFoundError from ready()."""
    problems = []
    for module in modules:
        try:
            import_module(module)
        except ImportError as exc:
            problems.append(f"LOOM_FLOW_MODULES: cannot import {module!r}: {exc}")
    return problems
