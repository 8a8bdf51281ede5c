"""Durable flows in one process: event shape, statements, idempotent starts, retries, replay safety,
snapshots and bounded reads, cancellation, the ownership hook, transient calls. SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from journal.flows import (
    ExecutionExists,
    InvalidInput,
    NonDeterminism,
    Outcome,
    OwnershipLost,
    UnknownExecution,
    UnknownFlow,
    cancel,
    describe,
    get_flow,
    invoke_transient,
    load_state,
    resume,
    start,
)
from journal.flows import ownership as own
from journal.models import Event, Execution, Fence, Snapshot
from tests.conftest import effect_rows
from tests.fixtures import flows_fixtures as fx

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _flows(settings):
    settings.LOOM_FLOW_MODULES = ["tests.fixtures.flows_fixtures"]
    settings.LOOM_SNAPSHOT_EVERY = None
    fx.CRASH_PASSES = False
    fx.VERSIONED_STEP = "alpha"
    installed = own.get_ownership()
    own.set_ownership(None)  # these tests are about the runtime; leases have their own suite
    yield
    own.set_ownership(installed)


def types(execution_id: str) -> list[str]:
    return [e.type for e in Event.objects.read(execution_id)]


def all_rows() -> dict[str, int]:
    """Row count of every table in the database."""
    counts = {}
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names(cursor):
            cursor.execute(f'SELECT count(*) FROM "{table}"')
            counts[table] = cursor.fetchone()[0]
    return counts


@pytest.mark.parametrize("steps", [0, 1, 3, 10])
def test_n_steps_write_exactly_2n_plus_2_events_in_order(steps):
    """The documented event shape: EXECUTION_STARTED, STEP_STARTED/STEP_COMPLETED per step, EXECUTION_COMPLETED."""
    out = start("test.chain", {"n": steps})
    assert out == Outcome(out.execution_id, "completed", sum(range(steps)), None)
    assert types(out.execution_id) == (["EXECUTION_STARTED"] + ["STEP_STARTED", "STEP_COMPLETED"] * steps
                                       + ["EXECUTION_COMPLETED"])
    assert [e.seq for e in Event.objects.read(out.execution_id)] == list(range(2 * steps + 2))


def test_header_is_kept_in_step_with_the_log():
    """The Execution header row says what the log says: flow, input, status, result, finished_at."""
    out = start("test.add", {"a": 2, "b": 3}, execution_id="calc-1")
    header = Execution.objects.get(pk="calc-1")
    assert (header.flow, header.status, header.input, header.result, header.error) == (
        "test.add", "completed", {"a": 2, "b": 3}, 5, "")
    assert header.finished_at is not None
    assert out.result == 5 and Fence.objects.current("calc-1") == 1


def test_minted_and_caller_chosen_starts_cost_the_same_statements():
    """Idempotency by construction: a caller-chosen id pays no extra read (the bootstrap refuses duplicates)."""
    start("test.add", {"a": 0, "b": 0})  # warm up: first-use imports and connection set-up
    with CaptureQueriesContext(connection) as minted:
        start("test.add", {"a": 1, "b": 1})
    with CaptureQueriesContext(connection) as chosen:
        start("test.add", {"a": 1, "b": 1}, execution_id="mine-1")
    assert len(minted.captured_queries) == len(chosen.captured_queries)
    assert all(not q["sql"].lstrip().upper().startswith("SELECT") for q in chosen.captured_queries
               if "journal_execution" in q["sql"] and "INSERT" not in q["sql"].upper())


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("steps", "statements"), [(0, 1), (1, 2), (3, 4)])
def test_postgres_run_costs_n_plus_1_statements(steps, statements):
    """Hot path on PostgreSQL: n+1 statements for n steps, header included, no reads."""
    start("test.chain", {"n": 0})
    with CaptureQueriesContext(connection) as ctx:
        start("test.chain", {"n": steps}, execution_id=f"cost-{steps}")
    assert len(ctx.captured_queries) == statements
    assert Execution.objects.get(pk=f"cost-{steps}").status == "completed"


def test_second_start_of_an_id_is_refused_before_any_step_runs(effects):
    """ExecutionExists says the execution exists and where it stands; the step's effect happened once."""
    start("test.once", {}, execution_id="only-once")
    before = all_rows()
    expected = r"'only-once' already exists \(status completed, flow test.once\)"
    with pytest.raises(ExecutionExists, match=expected) as err:
        start("test.once", {}, execution_id="only-once")
    assert (err.value.status, err.value.flow) == ("completed", "test.once")
    assert effect_rows() == [("only-once", "effect")]
    assert all_rows() == before


def test_invalid_input_writes_nothing():
    """Input that is not JSON-serialisable or does not validate raises InvalidInput; no row anywhere."""
    before = all_rows()
    with pytest.raises(InvalidInput, match="not JSON-serialisable"):
        start("test.add", {"a": {1, 2}, "b": 1})
    with pytest.raises(InvalidInput, match="does not validate"):
        start("test.add_model", {"a": "x", "b": 1})
    with pytest.raises(InvalidInput, match="invalid stream id"):
        start("test.add", {"a": 1, "b": 1}, execution_id="has space")
    with pytest.raises(UnknownFlow, match="no flow is registered as 'nope'"):
        start("nope", {})
    assert all_rows() == before


def test_input_model_is_validated_and_journaled_as_json():
    out = start("test.add_model", {"a": "4", "b": 5})
    assert out.result == 9
    assert Event.objects.read(out.execution_id)[0].payload == {"flow": "test.add_model", "input": {"a": 4, "b": 5}}


def test_retry_policy_retries_then_succeeds():
    """A retryable failure is recorded per attempt (STEP_FAILED retry=true) and the step tried again."""
    out = start("test.retry", {"key": "r1", "fail": 2, "attempts": 3})
    assert (out.status, out.result) == ("completed", 3)
    events = Event.objects.read(out.execution_id)
    assert [e.type for e in events] == ["EXECUTION_STARTED", "STEP_STARTED", "STEP_FAILED", "STEP_STARTED",
                                        "STEP_FAILED", "STEP_STARTED", "STEP_COMPLETED", "EXECUTION_COMPLETED"]
    assert [e.payload.get("attempt") for e in events if e.type == "STEP_STARTED"] == [1, 2, 3]
    assert all(e.payload["retry"] for e in events if e.type == "STEP_FAILED")


def test_exhausted_retries_fail_the_flow_and_record_why():
    out = start("test.retry", {"key": "r2", "fail": 9, "attempts": 2})
    assert out.status == "failed"
    assert "step 'flaky' (position 0) failed after 2 attempt(s): RuntimeError: attempt 2 of r2 fails" in out.error
    events = Event.objects.read(out.execution_id)
    assert events[-2].type == "STEP_FAILED" and events[-2].payload["retry"] is False
    assert events[-1].type == "EXECUTION_FAILED" and events[-1].payload["error"] == out.error
    header = Execution.objects.get(pk=out.execution_id)
    assert (header.status, header.error) == ("failed", out.error) and header.finished_at is not None


def test_non_retryable_error_fails_at_the_first_attempt():
    out = start("test.nonretryable", {"key": "nr"})
    assert out.status == "failed" and "after 1 attempt(s): NonRetryableError" in out.error
    assert types(out.execution_id).count("STEP_STARTED") == 1


def test_resume_replays_completed_steps_and_runs_the_rest():
    """A crashed run (nothing settled) is resumed: completed steps are not run again, the rest is."""
    with pytest.raises(fx.Crash):
        start("test.crashing", {}, execution_id="crashed")
    assert Execution.objects.get(pk="crashed").status == "running"
    fx.CRASH_PASSES = True
    out = resume("crashed")
    assert out == Outcome("crashed", "completed", "ok", None)
    assert types("crashed") == ["EXECUTION_STARTED", "STEP_STARTED", "STEP_COMPLETED", "STEP_STARTED",
                                "STEP_STARTED", "STEP_COMPLETED", "EXECUTION_COMPLETED"]
    assert Fence.objects.current("crashed") == 2
    assert resume("crashed") == out  # a settled execution is not run again


def test_resume_detects_non_determinism_and_writes_nothing():
    """Code that asks for another step than the log recorded stops with an error naming step and position."""
    with pytest.raises(fx.Crash):
        start("test.crashing", {}, execution_id="nd")
    fx.CRASH_PASSES = True
    flow = get_flow("test.crashing")
    original = flow.fn

    def changed(ctx, value):
        ctx.step("one", lambda: 1)
        ctx.step("renamed", lambda: 2)
        return "ok"

    object.__setattr__(flow, "fn", changed)
    try:
        before = len(Event.objects.read("nd"))
        with pytest.raises(NonDeterminism, match=r"at step position 1: the log recorded step 'two' but the code "
                                                 r"asked for step 'renamed'") as err:
            resume("nd")
        assert (err.value.position, err.value.recorded, err.value.requested) == (1, "two", "renamed")
        assert len(Event.objects.read("nd")) == before
    finally:
        object.__setattr__(flow, "fn", original)


def test_a_flow_that_no_longer_asks_for_recorded_steps_is_non_deterministic():
    with pytest.raises(fx.Crash):
        start("test.crashing", {}, execution_id="nd2")
    flow = get_flow("test.crashing")
    original = flow.fn
    object.__setattr__(flow, "fn", lambda ctx, value: "shortcut")
    try:
        with pytest.raises(NonDeterminism, match="recorded step 'one' but the code asked for no further step"):
            resume("nd2")
    finally:
        object.__setattr__(flow, "fn", original)


def test_cancel_is_recorded_and_a_running_flow_stops_at_its_next_step_boundary(effects):
    """cancel takes the fence and records EXECUTION_CANCELLED; the running flow's next write is refused."""
    out = start("test.self_cancel", {}, execution_id="cx")
    assert out == Outcome("cx", "cancelled", None, "stop please")
    assert types("cx") == ["EXECUTION_STARTED", "STEP_STARTED", "STEP_COMPLETED", "STEP_STARTED",
                           "EXECUTION_CANCELLED"]
    assert effect_rows() == []  # the step after the boundary never ran
    assert Execution.objects.get(pk="cx").status == "cancelled"
    assert resume("cx").status == "cancelled"
    assert cancel("cx").status == "cancelled"


def test_cancel_of_a_crashed_execution():
    with pytest.raises(fx.Crash):
        start("test.crashing", {}, execution_id="cc")
    assert cancel("cc", "operator").error == "operator"
    assert describe("cc")["status"] == "cancelled"
    with pytest.raises(UnknownExecution):
        cancel("missing")


def test_snapshots_bound_the_read_and_the_settle_checkpoint_lands_at_the_tip(settings):
    """With LOOM_SNAPSHOT_EVERY=2, loading a 102-event execution reads one snapshot and an empty tail:
    two queries, and the settle-time checkpoint is at the tip."""
    settings.LOOM_SNAPSHOT_EVERY = 2
    out = start("test.chain", {"n": 50})
    tip = Event.objects.tip(out.execution_id)
    assert tip == 101
    assert Snapshot.objects.latest(out.execution_id).seq == tip
    with CaptureQueriesContext(connection) as ctx:
        state = load_state(out.execution_id)
    assert len(ctx.captured_queries) == 2
    assert (state.status, state.result, state.seq, state.snapshot_seq) == ("completed", 1225, tip, tip)
    assert len(Event.objects.read(out.execution_id, after_seq=state.snapshot_seq)) == 0


def test_the_tail_after_the_newest_snapshot_stays_shorter_than_the_cadence(settings):
    """Settling checkpoints only if the tail reached LOOM_SNAPSHOT_EVERY; a load still reads < N tail rows."""
    settings.LOOM_SNAPSHOT_EVERY = 7
    out = start("test.chain", {"n": 50})
    snap = Snapshot.objects.latest(out.execution_id)
    tail = Event.objects.read(out.execution_id, after_seq=snap.seq)
    assert 0 < len(tail) < 7 and tail[-1].type == "EXECUTION_COMPLETED"
    with CaptureQueriesContext(connection) as ctx:
        state = load_state(out.execution_id)
    assert len(ctx.captured_queries) == 2 and (state.result, state.snapshot_seq) == (1225, snap.seq)


def test_a_running_execution_loads_from_snapshot_plus_a_tail_shorter_than_the_cadence(settings):
    settings.LOOM_SNAPSHOT_EVERY = 3
    fx.CRASH_PASSES = False
    with pytest.raises(fx.Crash):
        start("test.crashing", {}, execution_id="snap-run")
    snap = Snapshot.objects.latest("snap-run")
    tip = Event.objects.tip("snap-run")
    with CaptureQueriesContext(connection) as ctx:
        state = load_state("snap-run")
    assert len(ctx.captured_queries) == 2
    assert tip - snap.seq < 3 and state.seq == tip and state.steps[0][:3] == ["one", "completed", 1]


def test_no_snapshot_is_written_when_the_setting_is_unset():
    start("test.chain", {"n": 5}, execution_id="nosnap")
    assert Snapshot.objects.filter(stream_id="nosnap").count() == 0


def test_invoke_transient_writes_no_rows_of_any_table():
    """The transient path: same flow, same result, zero statements, zero rows anywhere."""
    before = all_rows()
    with CaptureQueriesContext(connection) as ctx:
        out = invoke_transient("test.add", {"a": 1, "b": 2})
        chained = invoke_transient("test.chain", {"n": 4})
        failed = invoke_transient("test.nonretryable", {"key": "tr"})
        retried = invoke_transient("test.retry", {"key": "tr2", "fail": 1, "attempts": 2})
    assert out == Outcome(None, "completed", 3, None)
    assert chained.result == 6 and retried.result == 2
    assert failed.status == "failed" and "NonRetryableError" in failed.error
    assert ctx.captured_queries == []
    assert all_rows() == before
    with pytest.raises(InvalidInput):
        invoke_transient("test.add_model", {"a": "x"})


def test_describe_shows_timeline_fence_and_snapshot(settings):
    settings.LOOM_SNAPSHOT_EVERY = 2
    out = start("test.retry", {"key": "d1", "fail": 1, "attempts": 2})
    view = describe(out.execution_id)
    assert (view["status"], view["result"], view["fence"], view["header_status"]) == ("completed", 2, 1, "completed")
    assert [(s["step"], s["attempt"], s["status"]) for s in view["steps"]] == [("flaky", 1, "retrying"),
                                                                               ("flaky", 2, "completed")]
    assert view["snapshot_seq"] == len(view["events"]) - 1
    with pytest.raises(UnknownExecution, match="'nope' does not exist"):
        describe("nope")


class RecordingOwnership:
    def __init__(self, lose_after: int | None = None):
        self.calls: list[tuple] = []
        self.lose_after = lose_after
        self.checks = 0

    def begin(self, execution_id, fence_token, *, fresh):
        self.calls.append(("begin", execution_id, fence_token, fresh))
        owner = self

        class Claim:
            @property
            def lost(self):
                owner.checks += 1
                return owner.lose_after is not None and owner.checks > owner.lose_after

            def end(self):
                owner.calls.append(("end", execution_id))

        return Claim()


def test_ownership_hook_is_called_after_the_bootstrap_and_ended_once():
    rec = RecordingOwnership()
    own.set_ownership(rec)
    start("test.chain", {"n": 2}, execution_id="o1")
    assert rec.calls == [("begin", "o1", 1, True), ("end", "o1")]
    with pytest.raises(fx.Crash):
        start("test.crashing", {}, execution_id="o2")
    fx.CRASH_PASSES = True
    rec.calls.clear()
    resume("o2")
    assert rec.calls == [("begin", "o2", 2, False), ("end", "o2")]


def test_a_lost_claim_stops_the_run_at_the_next_step_boundary_without_writing():
    rec = RecordingOwnership(lose_after=0)
    own.set_ownership(rec)
    with pytest.raises(OwnershipLost, match="'lost-1' stopped: its ownership claim was lost"):
        start("test.chain", {"n": 3}, execution_id="lost-1")
    assert types("lost-1") == ["EXECUTION_STARTED", "STEP_STARTED"]
    assert rec.calls[-1] == ("end", "lost-1")


def test_the_face_describe_stays_the_function_when_its_submodule_is_imported_first():
    """Before: in a process whose first use was `from journal.flows.describe import ...` (the async faces do),
    `from journal.flows import describe` gave the submodule ("'module' object is not callable" in the admin)."""
    import subprocess
    import sys

    code = ("import django, os; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'loomsite.settings'); django.setup(); "
            "from journal.flows.describe import describe as direct; from journal.flows import describe; "
            "assert describe is direct and callable(describe), describe")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
