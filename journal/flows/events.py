"""The event shape of an execution (docs/flows.md explains it; benchmarks rely on it).

EXECUTION_STARTED {flow, input}
  per step: STEP_STARTED {step, pos, attempt}
            STEP_COMPLETED {step, pos, attempt, result, ms}  or  STEP_FAILED {step, pos, attempt, error, retry, ms}
            (STEP_FAILED may carry more str fields an exception names in `journal_fields`: a Django task's
            attempt adds exception_class_path, traceback and worker, journal/tasks.py)
EXECUTION_COMPLETED {result} | EXECUTION_FAILED {error} | EXECUTION_CANCELLED {reason}
EXECUTION_RETRIED {attempt, actor, error, from_pos, steps}   (retry() of a failed execution: a new attempt)

Flows that wait (journal/flows/waits.py). A wait primitive takes a step position like a step; its
name starts with "$" ($sleep, $recv:<topic>, $child:<id>, $retry:<step>; $start_child and
$set_event:<key> are ordinary steps):
WAIT_STARTED {pos, step, kind, due_at (ISO or null), topic?, child?}   (the wait and its absolute due time)
  ... STEP_COMPLETED {step, pos, attempt, result, ms}                  (the wait ended: its result)
WAIT_WOKEN {pos, by}                          (wake_now(): the wait at pos ends at its next replay)
EXECUTION_SUSPENDED {by, reason}  EXECUTION_RESUMED {by, from_status}
EXECUTION_CONTINUED {next, result}            (continue_as_new: settles this run as completed)
EXECUTION_STARTED may carry "$start_at", "$deadline" (ISO), "$parent", "$previous", "$root",
"$forked_from" and "$steps" (the records a fork replays).

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

WAIT_STARTED = "WAIT_STARTED"
WAIT_WOKEN = "WAIT_WOKEN"
EXECUTION_SUSPENDED = "EXECUTION_SUSPENDED"
EXECUTION_RESUMED = "EXECUTION_RESUMED"
EXECUTION_CONTINUED = "EXECUTION_CONTINUED"

SETTLING = frozenset({EXECUTION_COMPLETED, EXECUTION_FAILED, EXECUTION_CANCELLED, EXECUTION_CONTINUED})
