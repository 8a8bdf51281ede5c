"""What a flow's code talks to: `ctx.step(name, fn, *args, retry=..., atomic=...)`.

`DurableContext` journals each step: STEP_STARTED is durable before the step's function runs;
its STEP_COMPLETED (or STEP_FAILED) is written behind, together with the next step's
STEP_STARTED or with the settling event, so a step costs one statement and not two. A crash
between a step's return and that write re-runs the step on resume, as a crash just before its
own write would; `atomic=True` runs the function and writes its completion in ONE database
transaction, so a step whose effects are rows of this database happens exactly once.

On replay (resume), a position the log recorded as completed returns its recorded result without
running; a different step name at a recorded position is NonDeterminism (never guessed).

Flows that wait (journal/flows/waits.py): sleep, sleep_until, recv, set_event, start_child (and its
handle's result), continue_as_new. A step's `timeout` cannot stop a running function (a thread cannot be
stopped safely): the step is told (journal/flows/interrupt.py: its `ctx.heartbeat()` raises, `ctx.cancelled()`
is True, and a worker's watchdog retires the process if it ignores that), an attempt that returns late counts as
failed (DeadlineExceeded, the retry policy decides), and a resume finding an attempt whose worker died past its
deadline records the timeout instead of running it again.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from journal import conf, jsonvalues
from journal.exceptions import InvalidStream
from journal.flows import events as ev
from journal.flows import interrupt
from journal.flows.errors import (
    ChildFailed,
    DeadlineExceeded,
    InvalidInput,
    NeedsDurable,
    NonDeterminism,
    StepCancelled,
    StepFailed,
)
from journal.flows.registry import prepare_start
from journal.flows.retry import RetryPolicy
from journal.flows.state import COMPLETED, FAILED, RETRYING, STARTED, WAITING, ExecutionState
from journal.ids import check_id, check_stored_id
from journal.privacy.codec import WITHHELD


class Halt(BaseException):
    """Carries a run-stopping error (takeover, duplicate start, non-determinism) through the flow's
    code: a BaseException, so a flow's `except Exception` cannot swallow it."""

    def __init__(self, error: Exception):
        self.error = error
        super().__init__(str(error))


@dataclass(slots=True)
class WaitSpec:
    """What a run parks on (journal/flows/waits.py writes it as the execution's wait row)."""

    kind: str  # sleep, recv, child, start, retry
    pos: int
    due_at: datetime | None
    topic: str = ""
    child: str = ""


class Park(BaseException):
    """Unwinds the flow's code when it must wait longer than LOOM_WAIT_INLINE_MAX: the runner writes
    what is pending, parks the execution (status waiting, a wait row) and gives up thread and lease.
    A BaseException, so a flow's `except Exception` cannot swallow it."""

    def __init__(self, spec: WaitSpec):
        self.spec = spec
        super().__init__(f"parked on {spec.kind} at position {spec.pos}")


class ContinueAsNew(BaseException):
    """ctx.continue_as_new(input): unwinds the flow's code; the runner starts the linked execution and
    settles this one."""

    def __init__(self, input: Any):
        self.input = input
        super().__init__("continue as new")


# The runtime's own unwinding: not a failure of the flow's code. Any other BaseException raised by a flow or a
# step (SystemExit from sys.exit() or argparse, KeyboardInterrupt, asyncio's CancelledError) is one: recorded
# with its class and traceback, under the retry policy, and never unwinds the worker's thread.
CONTROL = (Halt, Park, ContinueAsNew)
MAX_TRACE = 8000  # characters of an exit's traceback kept in its failure event (its last ones)


def exit_trace(exc: BaseException, secrets: list[str] | None = None) -> dict:
    """{"traceback": ...} of a failure (its last MAX_TRACE characters), scrubbed like its error text: any
    exception of a step or a flow, also a SystemExit (issue #28: a flow's ordinary exception showed no
    traceback). {} for a StepFailed (the step's own failure event holds its traceback) and for an exception
    that brings its own (a Django task's attempt, journal/tasks.py `journal_fields`)."""
    own = getattr(exc, "journal_fields", None)
    if isinstance(exc, StepFailed) or (isinstance(own, dict) and isinstance(own.get("traceback"), str)):
        return {}
    import traceback

    text = "".join(traceback.format_exception(exc))
    if secrets is None:
        return {"traceback": text[-MAX_TRACE:]}
    # The same redaction as the error text (_error_text): a pydantic ValidationError of the chain (a cause, a
    # context, a group's member) is shown by its description, without its input values (pydantic cuts a long
    # input value in the middle, so withholding the marked values would miss what is left of one), then every
    # marked value the run knows is withheld.
    for each in _chain(exc):
        if _is_validation_error(each):
            message = str(each)
            if message:
                text = text.replace(message, _described(each))
    text = _INPUT_VALUE.sub(r"input_value=<withheld>, input_type=", text)  # one quoted in another's message
    return {"traceback": _withhold(text, secrets)[-MAX_TRACE:]}


# pydantic's `input_value=<repr>, input_type=<type>` of one error line (a repr holds no newline): greedy, so that
# a value holding ", input_type=" itself is cut whole.
_INPUT_VALUE = re.compile(r"input_value=.*, input_type=")


def _chain(exc: BaseException) -> list[BaseException]:
    """`exc` and every exception a traceback of it shows: causes, contexts, an exception group's members."""
    seen: dict[int, BaseException] = {}
    todo = [exc]
    while todo:
        each = todo.pop()
        if id(each) in seen:
            continue
        seen[id(each)] = each
        todo += [e for e in (each.__cause__, each.__context__) if e is not None]
        todo += [e for e in getattr(each, "exceptions", ()) if isinstance(e, BaseException)]
    return list(seen.values())


def _is_validation_error(exc: BaseException) -> bool:
    from pydantic import ValidationError

    return isinstance(exc, ValidationError)


def _described(exc) -> str:
    """A pydantic ValidationError's message without its input values: where and what failed, per error."""
    described = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']} [type={e['type']}]"
                          for e in exc.errors(include_url=False, include_input=False, include_context=False))
    return f"{exc.error_count()} validation error(s) for {exc.title}: {described}"


def now() -> datetime:
    return timezone.now()


def iso(moment: datetime) -> str:
    return moment.isoformat()


def parse_time(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def check_seconds(value: Any, what: str) -> float:
    """A finite number of seconds >= 0, else InvalidInput (before anything is written)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InvalidInput(f"{what} must be a finite number of seconds >= 0, got {value!r}")
    return float(value)


def check_moment(value: Any, what: str) -> datetime:
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise InvalidInput(f"{what} must be a timezone-aware datetime, got {value!r}")
    return value


def check_name(value: Any, what: str) -> str:
    """A topic, message id or event key: what the database can hold as an id (journal/ids.py:
    1 to 200 characters, no NUL, no lone surrogate), else InvalidInput."""
    try:
        return check_stored_id(value, what)
    except InvalidStream as exc:
        raise InvalidInput(str(exc)) from None


def check_label(value: Any, what: str) -> str:
    """A new topic or message id: in the id alphabet (journal/ids.py: printable, no whitespace or control
    character, no dot segment), else InvalidInput. Both are pasted into log lines and the admin: a newline
    or an ANSI escape in one would forge a log line (#25)."""
    try:
        return check_id(value, what)
    except InvalidStream as exc:
        raise InvalidInput(str(exc)) from None


def inline_max() -> float:
    return conf.get("LOOM_WAIT_INLINE_MAX")


@dataclass(frozen=True, slots=True)
class Awaited:
    """What step_naps(awaits=True) yields for the call of a step's function: the loop calls and awaits it."""

    fn: Callable[..., Any]
    args: tuple


def slept(naps: Generator[float, None, Any]) -> Any:
    """Run a generator that yields in-process waits (seconds), sleeping each in this thread; its return value."""
    while True:
        try:
            seconds = next(naps)
        except StopIteration as done:
            return done.value
        time.sleep(seconds)


class ChildHandle:
    """A child flow started with ctx.start_child: its id, and `result()` to wait for it durably."""

    __slots__ = ("_ctx", "execution_id")

    def __init__(self, ctx: DurableContext, execution_id: str):
        self._ctx, self.execution_id = ctx, execution_id

    def result(self) -> Any:
        """The child's result once it completed; ChildFailed if it failed or was cancelled. Waits
        durably (the parent parks; the child's settle wakes it)."""
        return self._ctx._await_child(self.execution_id)

    def __repr__(self) -> str:
        return f"<ChildHandle {self.execution_id}>"


class Context:
    """The interface of both contexts. `transient` says whether anything is journaled."""

    transient: bool = True
    execution_id: str | None = None

    def step(self, name: str, fn: Callable[..., Any], *args: Any, retry: RetryPolicy | None = None,
             atomic: bool = False, timeout: float | None = None, heartbeat_timeout: float | None = None) -> Any:
        raise NotImplementedError

    def heartbeat(self, details: Any = None) -> None:
        """From inside a running step: it is alive; raises once it must stop (journal/flows/interrupt.py)."""
        interrupt.heartbeat(details)

    def cancelled(self) -> bool:
        """From inside a running step: whether it was told to stop (cancelled, timed out, taken over)."""
        return interrupt.cancelled()


def _error_text(exc: BaseException, secrets: list[str] | None = None) -> str:
    """What the log keeps of a failure: type and message. `secrets` (not None: the run holds marked data,
    journal/privacy) are the marked values the run knows in clear; they are cut out of the text, and a pydantic
    ValidationError is described without its input values (errors(include_input=False))."""
    explicit = getattr(exc, "journal_error", None)  # an exception that says how it is recorded (journal/tasks.py)
    if isinstance(explicit, str):
        return explicit[:2000] if secrets is None else _scrub(explicit, secrets)
    if secrets is None:
        return f"{type(exc).__name__}: {exc}"[:2000]
    message = _described(exc) if _is_validation_error(exc) else exc
    return _scrub(f"{type(exc).__name__}: {message}", secrets)


def _scrub(text: str, secrets: list[str]) -> str:
    """`text` with every one of `secrets` withheld, at most 2,000 characters (an error text)."""
    return _withhold(text, secrets)[:2000]


def _withhold(text: str, secrets: list[str]) -> str:
    """`text` with every one of `secrets` (longest first: a value inside another is cut with it) withheld."""
    for secret in secrets:
        text = text.replace(secret, WITHHELD)
    return text


def _failure_fields(exc: BaseException, failed: dict, secrets: list[str] | None) -> dict[str, str]:
    """More of a failed attempt for its STEP_FAILED (a Django task's class path, traceback, worker): the str
    fields of the exception's `journal_fields` that the payload has not got, marked values cut out."""
    fields = getattr(exc, "journal_fields", None)
    if not isinstance(fields, dict):
        return {}
    return {key: value[:20_000] if secrets is None else _scrub(value, secrets)
            for key, value in fields.items() if isinstance(key, str) and isinstance(value, str) and key not in failed}


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
             atomic: bool = False, timeout: float | None = None, heartbeat_timeout: float | None = None) -> Any:
        """Run `fn(*args)` as step `name`, journaled. `timeout` bounds one attempt and `heartbeat_timeout` the
        time between two heartbeats of the running step (journal/flows/interrupt.py: the step is told, and a
        worker's watchdog hands a silent step's lease back so another worker takes it over)."""
        return slept(self.step_naps(name, fn, args, retry, atomic, timeout, heartbeat_timeout))

    def step_naps(self, name: str, fn: Callable[..., Any], args: tuple, retry: RetryPolicy | None, atomic: bool,
                  timeout: float | None, heartbeat_timeout: float | None,
                  awaits: bool = False) -> Generator[Any, Any, Any]:
        """`step` as a generator that yields each in-process wait (a short retry backoff, in seconds) instead of
        sleeping it, and returns the step's result: `step` sleeps them in its thread (slept); an async flow
        driven from the loop sleeps them there (journal/flows/aio.py), holding no thread meanwhile. `awaits`
        (that async flow, a non-atomic step): the call of `fn` is yielded too, as Awaited(fn, args), and its
        result (or exception) is sent back: the loop awaits a coroutine function there."""
        runner = self._runner
        if timeout is not None:
            timeout = check_seconds(timeout, f"timeout of step {name!r}")
        if heartbeat_timeout is not None:
            heartbeat_timeout = check_seconds(heartbeat_timeout, f"heartbeat_timeout of step {name!r}")
        pos = self._pos
        self._pos = pos + 1
        steps = self._state.steps
        attempt = 1
        policy = retry or self._retry
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
            if status == RETRYING and len(recorded) > 4 and recorded[4]:
                yield from self._backoff(pos, parse_time(recorded[4]))  # the backoff its run parked on, if not over
            elif (status == STARTED and isinstance(recorded[2], dict) and recorded[2].get("deadline")
                  and now() >= parse_time(recorded[2]["deadline"])):  # its run died in it past its timeout
                error = _error_text(DeadlineExceeded(f"deadline exceeded: step {name!r} ran past its timeout"))
                again = policy.retries(DeadlineExceeded(error), attempt)
                runner.emit(ev.STEP_FAILED, {"step": name, "pos": pos, "attempt": attempt, "error": error,
                                             "retry": again, "ms": None, "timeout": True})
                if not again:
                    raise StepFailed(name, pos, error, attempt)
                attempt = yield from self._after_failure(pos, policy, attempt)
        while True:
            runner.before_work()  # a lost claim (or a passed deadline) stops the run here, before the step runs
            started = {"step": name, "pos": pos, "attempt": attempt}
            if timeout is not None:
                started["deadline"] = iso(now() + timedelta(seconds=timeout))
            runner.emit(ev.STEP_STARTED, started)
            runner.flush()  # durable before the step's function runs (the bootstrap, for the first)
            began = time.perf_counter()
            try:
                with interrupt.running(self.execution_id, name, pos, attempt, runner.claim, timeout,
                                       heartbeat_timeout):
                    if atomic:
                        result = runner.atomic_step(name, pos, attempt, began, fn, args, timeout)
                    elif awaits:
                        result = yield Awaited(fn, args)
                    else:
                        result = fn(*args)
                if not atomic:
                    problem = _jsonable(result)
                    if problem is not None:
                        raise StepFailed(name, pos, problem, attempt)
                    if timeout is not None and time.perf_counter() - began > timeout:
                        raise DeadlineExceeded(f"deadline exceeded: step {name!r} took longer than its timeout "
                                               f"of {timeout} s")
            except CONTROL:
                raise
            except BaseException as exc:  # SystemExit or KeyboardInterrupt too: a failed attempt (CONTROL)
                if isinstance(exc, StepCancelled):
                    runner.boundary()  # told because its claim was lost (cancel, takeover): the run stops here
                ms = round((time.perf_counter() - began) * 1000, 3)
                again = not isinstance(exc, StepFailed) and policy.retries(exc, attempt)
                secrets = runner.secrets(name)
                if isinstance(exc, StepFailed):
                    error = exc.error if secrets is None else _scrub(exc.error, secrets)
                else:
                    error = _error_text(exc, secrets)
                failed = {"step": name, "pos": pos, "attempt": attempt, "error": error, "retry": again, "ms": ms,
                          **exit_trace(exc, secrets)}
                if isinstance(exc, DeadlineExceeded):
                    failed["timeout"] = True
                failed.update(_failure_fields(exc, failed, secrets))
                delay = policy.delay(attempt) if again else 0.0
                if again and delay >= inline_max() and delay > 0:
                    failed["due_at"] = iso(now() + timedelta(seconds=delay))  # a parked backoff: its end
                runner.emit(ev.STEP_FAILED, failed)
                if not again:
                    raise StepFailed(name, pos, error, attempt) from exc
                attempt = yield from self._after_failure(pos, policy, attempt, failed.get("due_at"))
                continue
            if not atomic:
                runner.emit(ev.STEP_COMPLETED, {"step": name, "pos": pos, "attempt": attempt, "result": result,
                                                "ms": round((time.perf_counter() - began) * 1000, 3)})
            return result

    def _after_failure(self, pos: int, policy: RetryPolicy, attempt: int,
                       due_at: str | None = None) -> Generator[float, None, int]:
        """The backoff after a failed attempt: slept in-process when short (yielded), parked on a timer when not."""
        if due_at is not None:
            self._runner.flush()  # the failed attempt and its backoff's end are durable before parking
            yield from self._backoff(pos, parse_time(due_at))
        else:
            delay = policy.delay(attempt)
            if delay:
                self._runner.flush()  # record the failed attempt before waiting
                yield delay
        return attempt + 1

    def _backoff(self, pos: int, due: datetime) -> Generator[float, None, None]:
        """Wait until a parked backoff's end (recorded in its STEP_FAILED): park, or return if over."""
        record = self._state.steps[pos]
        if len(record) > 4 and record[4] is None:  # woken early (wake_now)
            return
        remaining = (due - now()).total_seconds()
        if remaining <= 0:
            return
        self._runner.before_work()  # woken at the execution's deadline: it passed, do not park again
        if remaining < inline_max():
            yield remaining
            return
        raise Park(WaitSpec("retry", pos, self._runner.cap(due)))

    # -- flows that wait ------------------------------------------------------------------------
    def _position(self, name: str) -> tuple[int, list | None]:
        """The next position and its record if the log has one (NonDeterminism if another name)."""
        pos = self._pos
        self._pos = pos + 1
        steps = self._state.steps
        if pos < len(steps):
            recorded = steps[pos]
            if recorded[0] != name:
                raise Halt(NonDeterminism(self.execution_id, pos, recorded[0], name))
            return pos, recorded
        return pos, None

    def _begin_wait(self, pos: int, name: str, kind: str, recorded: list | None, due: datetime | None,
                    **extra: str) -> tuple[datetime | None, bool]:
        """Record the wait (once: a replay finds it in the log); its due time and whether it was woken."""
        self._runner.before_work()
        if recorded is not None and recorded[1] == WAITING:
            info = recorded[2] or {}
            return parse_time(info.get("due_at")), bool(info.get("woken"))
        self._runner.emit(ev.WAIT_STARTED, {"pos": pos, "step": name, "kind": kind,
                                            "due_at": None if due is None else iso(due), **extra})
        return due, False

    def _end_wait(self, pos: int, name: str, result: Any = None) -> Any:
        self._runner.emit(ev.STEP_COMPLETED, {"step": name, "pos": pos, "attempt": 1, "result": result, "ms": None})
        return result

    def sleep(self, seconds: float) -> None:
        """Wait `seconds` durably: the due time is recorded; a long wait parks (no thread, no lease)
        and any worker wakes it; a replay never sleeps again for time that has passed."""
        seconds = check_seconds(seconds, "sleep")
        self._sleep_until(now() + timedelta(seconds=seconds))

    def sleep_until(self, when: datetime) -> None:
        """Wait until `when` (an aware datetime) durably, as sleep()."""
        self._sleep_until(check_moment(when, "sleep_until"))

    def _sleep_until(self, due: datetime) -> None:
        pos, remaining = self._sleep_begin(due)
        if pos is not None:
            if remaining > 0:
                time.sleep(remaining)
            self._end_wait(pos, "$sleep")

    def _sleep_begin(self, due: datetime) -> tuple[int | None, float]:
        """A sleep up to its in-process part: (its position, the seconds left to sleep here, 0 for none), or
        (None, 0) when the log says it ended. A long one parks (Park); a short one is flushed first (its
        WAIT_STARTED is durable before the sleep). Split so that an async flow driven from the loop sleeps
        the seconds there (journal/flows/aio.py), not in a thread."""
        name = "$sleep"
        pos, recorded = self._position(name)
        if recorded is not None and recorded[1] == COMPLETED:
            return None, 0.0
        due, woken = self._begin_wait(pos, name, "sleep", recorded, due)
        remaining = (due - now()).total_seconds()
        if woken or remaining <= 0:
            return pos, 0.0
        if remaining >= inline_max():
            raise Park(WaitSpec("sleep", pos, self._runner.cap(due)))
        if self._runner.pending:  # a resumed run replaying this sleep has its WAIT_STARTED durable already:
            self._runner.flush()  # an empty write would be refused and halt the resume
        return pos, remaining

    def recv(self, topic: str, timeout: float | None = None) -> Any:
        """The payload of the next message sent to this execution on `topic`, consumed exactly once
        (its consumption commits with this wait's record); None once `timeout` seconds passed."""
        topic = check_name(topic, "topic")
        due = None if timeout is None else now() + timedelta(seconds=check_seconds(timeout, "recv timeout"))
        name = f"$recv:{topic}"
        pos, recorded = self._position(name)
        if recorded is None:  # a new wait: its topic one that send() accepts (a recorded one replays as it was)
            check_label(topic, "topic")
        if recorded is not None and recorded[1] == COMPLETED:
            return recorded[2]
        due, woken = self._begin_wait(pos, name, "recv", recorded, due, topic=topic)
        found = self._runner.take_message(pos, name, topic)
        if found is not None:
            return found[0]
        if woken or (due is not None and now() >= due):
            return self._end_wait(pos, name, None)
        raise Park(WaitSpec("recv", pos, self._runner.cap(due), topic=topic))

    def set_event(self, key: str, value: Any) -> None:
        """Publish `value` under `key` for get_event() callers; journaled (a replay does not set it
        again) and written with its step record in one transaction."""
        key = check_name(key, "event key")
        problem = jsonvalues.problem(value, "event value")
        if problem is not None:
            raise InvalidInput(problem)
        self.step(f"$set_event:{key}", self._runner.put_event, key, value, atomic=True)

    def start_child(self, flow: Any, input: Any, execution_id: str | None = None) -> ChildHandle:
        """Start a child execution (run by a worker); the child id is deterministic (this execution's
        id and the step position), so a replay never starts a second child."""
        pos = self._pos
        child_id = execution_id or f"{self.execution_id}.child-{pos}"
        definition, _, stored, child_id = prepare_start(flow, input, child_id)  # bad input: nothing written
        started = self.step("$start_child", self._runner.spawn_child, definition.name, stored, child_id)
        return ChildHandle(self, started)

    def _await_child(self, child_id: str) -> Any:
        name = f"$child:{child_id}"
        pos, recorded = self._position(name)
        if recorded is None or recorded[1] != COMPLETED:
            self._begin_wait(pos, name, "child", recorded, None, child=child_id)
            outcome, link = self._runner.child_outcome(child_id)
            if outcome is None:  # wait for the run the child is now (the newest of a continue_as_new chain)
                recheck = now() + timedelta(seconds=conf.get("LOOM_WAIT_RECHECK"))
                raise Park(WaitSpec("child", pos, self._runner.cap(recheck), child=link))
            recorded = [name, COMPLETED, self._end_wait(pos, name, outcome), 1]
        outcome = recorded[2]
        if outcome["status"] != "completed":
            raise ChildFailed(child_id, outcome["status"], outcome.get("error"))
        return outcome.get("result")

    def continue_as_new(self, input: Any) -> None:
        """End this run and start a fresh log under a linked id with `input` (never returns)."""
        problem = jsonvalues.problem(input, "input")
        if problem is not None:
            raise InvalidInput(problem)
        raise ContinueAsNew(input)

    def patched(self, patch_id: str) -> bool:
        """Whether this execution takes the new branch of a change marked `patch_id` (docs/flows.md
        "Versions"): `if ctx.patched("tax-v2"): <new code> else: <old code>`.

        Where the log has recorded this position already, it decides: a `$patch:<id>` marker there means
        the execution took the new branch (True, the position is used); anything else means it got past
        this point on the code before the marker (False, and no position is used, so the old branch's
        steps replay at the positions they were recorded at). Where nothing is recorded yet the execution
        takes the new branch and records the marker (one STEP_COMPLETED, written with its next write), so
        every later replay, on any worker, takes it again."""
        name = f"$patch:{check_name(patch_id, 'patch id')}"
        pos = self._pos
        steps = self._state.steps
        if pos < len(steps):
            if steps[pos][0] != name:
                return False
            self._pos = pos + 1
            return True
        self._pos = pos + 1
        self._runner.emit(ev.STEP_COMPLETED, {"step": name, "pos": pos, "attempt": 1, "result": True, "ms": None})
        return True

    def deprecate_patch(self, patch_id: str) -> None:
        """The old branch of `patch_id` is gone (no execution without the marker is live: docs/flows.md
        "Versions"): an execution that recorded the marker here uses its position up, and nothing new is
        recorded. `if ctx.patched(id): new else: old` becomes `ctx.deprecate_patch(id); new`."""
        name = f"$patch:{check_name(patch_id, 'patch id')}"
        pos = self._pos
        if pos < len(self._state.steps) and self._state.steps[pos][0] == name:
            self._pos = pos + 1

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

    def sleep(self, seconds: float) -> None:
        time.sleep(check_seconds(seconds, "sleep"))

    def sleep_until(self, when: datetime) -> None:
        time.sleep(max(0.0, (check_moment(when, "sleep_until") - now()).total_seconds()))

    def set_event(self, key: str, value: Any) -> None:
        """Nothing to publish to: a transient call has no execution."""

    def recv(self, topic: str, timeout: float | None = None) -> Any:
        raise NeedsDurable("ctx.recv needs a durable execution (start() it), not invoke_transient")

    def start_child(self, flow: Any, input: Any, execution_id: str | None = None):
        raise NeedsDurable("ctx.start_child needs a durable execution (start() it), not invoke_transient")

    def continue_as_new(self, input: Any) -> None:
        raise NeedsDurable("ctx.continue_as_new needs a durable execution (start() it), not invoke_transient")

    def patched(self, patch_id: str) -> bool:
        """A transient call has no recorded past: always the new branch."""
        check_name(patch_id, "patch id")
        return True

    def deprecate_patch(self, patch_id: str) -> None:
        check_name(patch_id, "patch id")

    def step(self, name: str, fn: Callable[..., Any], *args: Any, retry: RetryPolicy | None = None,
             atomic: bool = False, timeout: float | None = None, heartbeat_timeout: float | None = None) -> Any:
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
