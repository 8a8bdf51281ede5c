"""The event shape of an execution (docs/flows.md explains it; benchmarks rely on it).

EXECUTION_STARTED {flow, input}
  per step: STEP_STARTED {step, pos, attempt}
            STEP_COMPLETED {step, pos, attempt, result, ms}  or  STEP_FAILED {step, pos, attempt, error, retry, ms}
EXECUTION_COMPLETED {result} | EXECUTION_FAILED {error} | EXECUTION_CANCELLED {reason}
EXECUTION_RETRIED {attempt, actor, error, from_pos, steps}   (retry() of a failed execution: a new attempt)

n steps that succeed first time: exactly 2n + 2 events.
"""

EXECUTION_STARTED = "EXECUTION_STARTED"
STEP_STARTED = "STEP_STARTED"
STEP_COMPLETED = "STEP_COMPLETED"
STEP_FAILED = "STEP_FAILED"
EXECUTION_COMPLETED = "EXECUTION_COMPLETED"
EXECUTION_FAILED = "EXECUTION_FAILED"
EXECUTION_CANCELLED = "EXECUTION_CANCELLED"
EXECUTION_RETRIED = "EXECUTION_RETRIED"

SETTLING = frozenset({EXECUTION_COMPLETED, EXECUTION_FAILED, EXECUTION_CANCELLED})
