"""The errors of durable flows. Each message names the execution, flow or step at fault."""

from __future__ import annotations

from journal.exceptions import JournalError


class FlowError(JournalError):
    """Base class of every error raised by journal.flows."""


class UnknownFlow(FlowError, LookupError):
    """No flow is registered under that name (is its module in LOOM_FLOW_MODULES?)."""

    def __init__(self, name: str, version: int | None = None, have: list[int] | None = None):
        self.name, self.version = name, version
        if version is None:
            super().__init__(f"no flow is registered as {name!r}; import its module or list it in LOOM_FLOW_MODULES")
        else:  # the flow is here, not the version an execution started on (docs/flows.md "Versions")
            super().__init__(f"flow {name!r} version {version} is not registered in this process (it has "
                             f"versions {have}); a worker with that version runs its executions")


class UnknownExecution(FlowError, LookupError):
    """No execution has that id: its stream has no events."""

    def __init__(self, execution_id: str):
        self.execution_id = execution_id
        super().__init__(f"execution {execution_id!r} does not exist")


class InvalidInput(FlowError, ValueError):
    """The input of a flow does not validate or is not JSON-serialisable; nothing was written."""


class ExecutionExists(FlowError):
    """A start named an execution id that already exists; refused before any step ran."""

    def __init__(self, execution_id: str, status: str, flow: str = "", result=None, error: str = ""):
        self.execution_id, self.status, self.flow, self.result, self.error = execution_id, status, flow, result, error
        where = f"status {status}" + (f", flow {flow}" if flow else "")
        super().__init__(f"execution {execution_id!r} already exists ({where}); nothing was started. "
                         f"Use describe() to read it or resume() to continue it")


class NonDeterminism(FlowError):
    """The flow asked for a different step than its log recorded at that position (code changed under it)."""

    def __init__(self, execution_id: str, position: int, recorded: str, requested: str | None):
        self.execution_id, self.position, self.recorded, self.requested = execution_id, position, recorded, requested
        asked = f"step {requested!r}" if requested is not None else "no further step (the flow returned)"
        super().__init__(f"non-determinism in execution {execution_id!r} at step position {position}: "
                         f"the log recorded step {recorded!r} but the code asked for {asked}; "
                         f"nothing was written (deploy the code the execution started with, then resume)")


class OwnershipLost(FlowError):
    """This run no longer owns the execution (a resume took over, or its lease was lost); it stopped
    without writing anything further."""

    def __init__(self, execution_id: str, detail: str):
        self.execution_id = execution_id
        super().__init__(f"run of execution {execution_id!r} stopped: {detail}; nothing further was written")


class ShuttingDown(OwnershipLost):
    """The process is shutting down gracefully (LOOM_SHUTDOWN_GRACE): the run stopped at a step boundary, its
    finished step recorded, and handed its lease back so that another worker continues it at once."""

    def __init__(self, execution_id: str):
        super().__init__(execution_id, "its worker is shutting down; the lease was handed back for another worker")


class NotResumable(FlowError):
    """The execution cannot be resumed or cancelled in its current state."""


class ExecutionBusy(NotResumable):
    """Another process provably drives the execution (a live lease, or a fresh run still within its
    lazy-lease grace): taking it over would run its in-flight step twice. Wait for the lease to
    expire (the recovery sweep takes it over then) or force it."""

    def __init__(self, execution_id: str, holder: str):
        self.execution_id, self.holder = execution_id, holder
        super().__init__(f"execution {execution_id!r} is running under {holder}; not taken over "
                         f"(wait for its lease to expire, or force it)")


class NonRetryableError(Exception):
    """Raise from a step to fail it at once, whatever its retry policy says."""


class StepFailed(FlowError):
    """A step failed for good (attempts exhausted or non-retryable). Uncaught, it fails the flow."""

    def __init__(self, step: str, position: int, error: str, attempts: int):
        self.step, self.position, self.error, self.attempts = step, position, error, attempts
        super().__init__(f"step {step!r} (position {position}) failed after {attempts} attempt(s): {error}")


class ExecutionFinished(NotResumable):
    """The execution has settled (completed, failed or cancelled): it takes no message, wake-up or
    suspend any more; nothing was written."""

    def __init__(self, execution_id: str, status: str, what: str = "that"):
        self.execution_id, self.status = execution_id, status
        super().__init__(f"execution {execution_id!r} already {status}; {what} was refused and nothing written")


class ChildFailed(FlowError):
    """A child flow awaited with handle.result() failed or was cancelled."""

    def __init__(self, child_id: str, status: str, error: str | None):
        self.child_id, self.status, self.error = child_id, status, error
        super().__init__(f"child execution {child_id!r} {status}: {error or 'no error recorded'}")


class DeadlineExceeded(FlowError):
    """An execution's deadline (start(..., timeout=)) or a step's (ctx.step(..., timeout=)) passed."""


class NeedsDurable(FlowError):
    """A primitive that waits for something outside the flow (recv, start_child, continue_as_new) was
    called in a transient call (invoke_transient), which has no journal to wait in."""


class StepCancelled(FlowError):
    """Raised by `heartbeat()` (journal/flows/interrupt.py) inside a running step that was told to stop: its
    execution was cancelled or taken over, its heartbeat timed out, or its worker is retiring. A step that lets
    it propagate ends at once; its attempt is never recorded as completed (the fence refuses this run)."""


class StepTimedOut(DeadlineExceeded):
    """Raised by `heartbeat()` inside a running step past its `timeout`: the attempt fails as timed out
    (STEP_FAILED {"timeout": true}) and the retry policy decides what follows."""
