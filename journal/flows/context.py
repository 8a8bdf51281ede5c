"""What a flow's code talks to: `ctx.step(name, fn, *args, retry=..., atomic=...)`.

`DurableContext` journals each step: STEP_STARTED is durable before the step's function runs;
its STEP_COMPLETED (or STEP_FAILED) is written behind, together with the next step's
STEP_STARTED or with the settling event, so a step costs one statement and not two. A crash
between a step's return and that write re-runs the step on resume, as a crash just before its
own write would; `atomic=True` runs the function and writes its completion in ONE database
transaction, so a step whose effects are rows of this database happens exactly once.

On replay (resume), a position the log recorded as completed returns its recorded result without
running; a different step name at a recorded position is NonDeterminism (never guessed).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from journal import jsonvalues
from journal.flows import events as ev
from journal.flows.errors import NonDeterminism, StepFailed
from journal.flows.retry import RetryPolicy
from journal.flows.state import COMPLETED, FAILED, RETRYING, ExecutionState


class Halt(BaseException):
    """Carries a run-stopping error (takeover, duplicate start, non-determinism) through the flow's
    code: a BaseException, so a flow's `except Exception` cannot swallow it."""

    def __init__(self, error: Exception):
        self.error = error
        super().__init__(str(error))


class Context:
    """The interface of both contexts. `transient` says whether anything is journaled."""

    transient: bool = True
    execution_id: str | None = None

    def step(self, name: str, fn: Callable[..., Any], *args: Any, retry: RetryPolicy | None = None,
             atomic: bool = False) -> Any:
        raise NotImplementedError


def _error_text(exc: BaseException, secrets: list[str] | None = None) -> str:
    """What the log keeps of a failure: type and message. `secrets` (not None: the run holds marked data,
    journal/privacy) are the marked values the run knows in clear; they are cut out of the text, and a pydantic
    ValidationError is described without its input values (errors(include_input=False))."""
    if secrets is None:
        return f"{type(exc).__name__}: {exc}"[:2000]
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        described = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']} [type={e['type']}]"
                              for e in exc.errors(include_url=False, include_input=False, include_context=False))
        text = f"{type(exc).__name__}: {exc.error_count()} validation error(s) for {exc.title}: {described}"
    else:
        text = f"{type(exc).__name__}: {exc}"
    return _scrub(text, secrets)


def _scrub(text: str, secrets: list[str]) -> str:
    """`text` with every one of `secrets` (longest first: a value inside another is cut with it) withheld."""
    from journal.privacy.codec import WITHHELD

    for secret in secrets:
        text = text.replace(secret, WITHHELD)
    return text[:2000]


def _jsonable(value: Any) -> str | None:
    """None if the journal can store value (journal/jsonvalues.py: the rules every payload follows), else why not."""
    return jsonvalues.problem(value, "result")


class DurableContext(Context):
    transient = False

    def __init__(self, runner, state: ExecutionState, default_retry: RetryPolicy):
        self._runner = runner
        self._state = state
        self._retry = default_retry
        self._pos = 0
        self.execution_id = state.execution_id

    def step(self, name: str, fn: Callable[..., Any], *args: Any, retry: RetryPolicy | None = None,
             atomic: bool = False) -> Any:
        runner = self._runner
        pos = self._pos
        self._pos = pos + 1
        steps = self._state.steps
        attempt = 1
        if pos < len(steps):
            recorded = steps[pos]
            if recorded[0] != name:
                raise Halt(NonDeterminism(self.execution_id, pos, recorded[0], name))
            status = recorded[1]
            if status == COMPLETED:
                return recorded[2]
            if status == FAILED:
                raise StepFailed(name, pos, recorded[2], recorded[3])
            attempt = recorded[3] + (1 if status == RETRYING else 0)
        policy = retry or self._retry
        while True:
            runner.boundary()  # a lost claim stops the run here, before the step runs
            runner.emit(ev.STEP_STARTED, {"step": name, "pos": pos, "attempt": attempt})
            runner.flush()  # durable before the step's function runs (the bootstrap, for the first)
            began = time.perf_counter()
            try:
                if atomic:
                    result = runner.atomic_step(name, pos, attempt, began, fn, args)
                else:
                    result = fn(*args)
                    problem = _jsonable(result)
                    if problem is not None:
                        raise StepFailed(name, pos, problem, attempt)
            except Halt:
                raise
            except Exception as exc:
                ms = round((time.perf_counter() - began) * 1000, 3)
                again = not isinstance(exc, StepFailed) and policy.retries(exc, attempt)
                secrets = runner.secrets(name)
                if isinstance(exc, StepFailed):
                    error = exc.error if secrets is None else _scrub(exc.error, secrets)
                else:
                    error = _error_text(exc, secrets)
                runner.emit(ev.STEP_FAILED, {"step": name, "pos": pos, "attempt": attempt, "error": error,
                                             "retry": again, "ms": ms})
                if not again:
                    raise StepFailed(name, pos, error, attempt) from exc
                delay = policy.delay(attempt)
                if delay:
                    runner.flush()  # record the failed attempt before waiting
                    time.sleep(delay)
                attempt += 1
                continue
            if not atomic:
                runner.emit(ev.STEP_COMPLETED, {"step": name, "pos": pos, "attempt": attempt, "result": result,
                                                "ms": round((time.perf_counter() - began) * 1000, 3)})
            return result

    def check_consumed(self) -> None:
        """On return of the flow: the log must not hold steps the code no longer asked for."""
        if self._pos < len(self._state.steps):
            raise Halt(NonDeterminism(self.execution_id, self._pos, self._state.steps[self._pos][0], None))


class TransientContext(Context):
    """Runs steps in-process with their retry policy; writes nothing."""

    __slots__ = ("_pos", "_retry")
    transient = True

    def __init__(self, default_retry: RetryPolicy):
        self._retry = default_retry
        self._pos = 0

    def step(self, name: str, fn: Callable[..., Any], *args: Any, retry: RetryPolicy | None = None,
             atomic: bool = False) -> Any:
        pos = self._pos
        self._pos = pos + 1
        policy = retry or self._retry
        attempt = 1
        while True:
            try:
                return fn(*args)
            except Exception as exc:
                if not policy.retries(exc, attempt):
                    raise StepFailed(name, pos, _error_text(exc), attempt) from exc
                delay = policy.delay(attempt)
                if delay:
                    time.sleep(delay)
                attempt += 1
