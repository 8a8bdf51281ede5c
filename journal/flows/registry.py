"""Defining flows: `@flow(name, input_model=..., retry=...)` registers a plain function by name.

A flow is `fn(ctx, input) -> result`. Its input and result are JSON-serialisable (a pydantic
`input_model` validates the input; the flow then receives the model instance and the journal
keeps `model_dump(mode="json")`). The registry is per process: every process that starts or
resumes a flow must import its module (LOOM_FLOW_MODULES does that at start-up).

Versions (docs/flows.md "Versions"): `@flow("orders.charge", version=2)` registers a second version
beside the first. A new start runs on the newest version this process has; every execution records the
version it started on (EXECUTION_STARTED `$version`, the header's `flow_version`) and is resumed only on
that version: a process without it leaves the execution to one that has it (`runnable()` is what a
worker's sweep, waker and dispatcher claim for).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from typing import Any

from ulid import ULID

from journal import conf, envelopes, jsonvalues
from journal.exceptions import InvalidPayload, InvalidStream
from journal.flows.errors import InvalidInput, UnknownFlow
from journal.flows.retry import NO_RETRY, RetryPolicy
from journal.privacy import marking

_REGISTRY: dict[str, dict[int, Flow]] = {}  # name -> version -> Flow
_NEWEST: dict[str, Flow] = {}  # name -> its newest version (the transient path's one lookup)


@dataclass(frozen=True, slots=True)
class Flow:
    name: str
    fn: Callable[..., Any]
    input_model: type | None = None
    retry: RetryPolicy = NO_RETRY
    version: int = 1

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


MAX_VERSION = 2**31 - 1  # the header's flow_version is a 32-bit integer on both databases


def flow(name: str | Callable | None = None, *, input_model: type | None = None,
         retry: RetryPolicy | None = None, version: int = 1):
    """Register a flow: `@flow("calc.add")`, `@flow(name="calc.add", retry=RetryPolicy(3))` or bare `@flow`
    (named module.qualname). `retry` is the default policy of the flow's steps. `version` (1 unless
    given): a changed flow whose executions in flight must keep the old code registers its new code as
    version 2 beside version 1 (docs/flows.md "Versions")."""
    if callable(name):  # bare @flow
        return flow()(name)
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= MAX_VERSION:
        raise ValueError(f"flow version must be an integer from 1 to {MAX_VERSION}, got {version!r}")

    def register(fn: Callable) -> Flow:
        flow_name = name or f"{fn.__module__}.{fn.__qualname__}"
        if not isinstance(flow_name, str) or not flow_name or len(flow_name) > 200:
            raise ValueError(f"flow name must be a non-empty string of at most 200 characters, got {flow_name!r}")
        existing = _REGISTRY.get(flow_name, {}).get(version)
        if existing is not None and (existing.fn.__module__, existing.fn.__qualname__) != (
                fn.__module__, fn.__qualname__):
            raise ValueError(f"flow {flow_name!r} version {version} is already registered by "
                             f"{existing.fn.__module__}.{existing.fn.__qualname__}")
        defined = Flow(flow_name, fn, input_model, retry or NO_RETRY, version)
        if input_model is not None:  # marked input fields (journal/privacy) are sealed in EXECUTION_STARTED
            marking.declare_model("EXECUTION_STARTED", input_model, ("input",), (("flow",), flow_name))
        _REGISTRY.setdefault(flow_name, {})[version] = defined
        _NEWEST[flow_name] = _REGISTRY[flow_name][max(_REGISTRY[flow_name])]
        return defined

    return register


def get_flow(name: str | Flow, version: int | None = None) -> Flow:
    """The flow registered under `name` (a Flow is returned as is): its newest version here, or exactly
    `version` (an execution resumes only on the version it started on); UnknownFlow otherwise."""
    if isinstance(name, Flow):
        return name
    try:
        versions = _REGISTRY[name]
    except (KeyError, TypeError):
        raise UnknownFlow(name) from None
    if version is None:
        return versions[max(versions)]
    try:
        return versions[version]
    except (KeyError, TypeError):
        raise UnknownFlow(name, version, sorted(versions)) from None


INTERNAL_PREFIX = "loom."
"""Flows named so are Loom's own machinery (the Tasks backend's `loom.task` imports and calls a task by
path): started by Loom's code, never by a caller from outside unless LOOM_EXPOSED_INTERNAL_FLOWS names them."""


def new_execution_id() -> str:
    """A new execution id (a ULID: in the id alphabet, sortable by its time)."""
    return str(ULID())


def prepare_start(flow: str | Flow, input: Any, execution_id: str | None) -> tuple[Flow, Any, Any, str]:
    """What every start checks before anything is written or queued: the flow is known, its input is
    valid and storable, the id is a new stream id in the alphabet (a ULID is minted when none is given).
    Returns (flow, input as the flow sees it, input as it is stored, execution id). Here, beside the
    flows, so that every start path (the runtime, a child, a continuation, a queued start) checks from below."""
    definition = get_flow(flow)
    value, stored = definition.prepare(input)
    if execution_id is None:
        return definition, value, stored, new_execution_id()
    try:
        envelopes.check_new_stream_id(execution_id)  # looked up at the call: the id rule has one home
    except InvalidStream as exc:
        raise InvalidInput(str(exc)) from None
    return definition, value, stored, execution_id


def is_internal(name: str) -> bool:
    return name.startswith(INTERNAL_PREFIX)


def exposed(name: str) -> bool:
    """May a caller from outside (an API token, the admin's schedule form) start or call flow `name`?
    Every flow but an internal one that LOOM_EXPOSED_INTERNAL_FLOWS does not name exactly."""
    return not is_internal(name) or name in conf.get("LOOM_EXPOSED_INTERNAL_FLOWS")


def registered() -> dict[str, Flow]:
    """Every flow name registered here, with its newest version."""
    return {name: versions[max(versions)] for name, versions in _REGISTRY.items()}


def versions(name: str) -> list[int]:
    """The versions of flow `name` registered here, oldest first (empty: none)."""
    return sorted(_REGISTRY.get(name, ()))


def runnable() -> list[tuple[str, int]]:
    """(flow, version) of every flow version this process can run, sorted: what a worker claims for
    (the recovery sweep, the waker; an execution of another version is left to a worker that has it)."""
    return sorted((name, version) for name, versions in _REGISTRY.items() for version in versions)


def started_version(execution_flow: str, version: int | None = None) -> int:
    """The version a new execution of `execution_flow` starts on: `version` if given (a fork keeps its
    original's), else the newest registered here (1 for a flow this process does not have). Every start
    path takes it from here, through journal/flows/writer.py's bootstrap."""
    if version is not None:
        return version
    found = _REGISTRY.get(execution_flow)
    return max(found) if found else 1




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
