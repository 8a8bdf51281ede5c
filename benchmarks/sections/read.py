"""Section `read`: loading the state of a short and a long **running** execution, as a resume does.

A resume (or a takeover, or `outcome_of`) starts with `load_state`: the newest snapshot, then the
events after it. What that costs depends on the length of a running execution's log: its snapshot
carries one record per completed step, and the tail after it is read and folded. (A settled
execution's snapshot drops its step records, so loading a settled one says nothing about this.)

Two executions of the same flow are left running the way a crashed worker leaves them: the flow's
last step raises out of the process's runner (a BaseException, as an interrupt would), after 1 and
after 50 completed steps (4 and 102 events). With LOOM_SNAPSHOT_EVERY=16 the long one has a
snapshot of 50 step records and a tail of a few events; the short one has no snapshot and a tail of 4.
N threads load each repeatedly. Every load is counted: the statements it issued (a connection-level
counter at the driver, `benchmarks.harness.counting_statements`) and the rows it read (the snapshot,
if any, plus the tail it folded).
Recorded per length: reads/s, p50..max, statements per read, rows per read; then the p50 ratio
long/short. Finally both executions are resumed to completion, which verifies the loaded state:
a resume replays the recorded steps (none runs again) and runs the last one.
"""

from __future__ import annotations

import threading

from django.db import connection
from django.test.utils import override_settings

from benchmarks import streams
from benchmarks.arguments import positive_int
from benchmarks.cells import raise_errors
from benchmarks.harness import counting_statements, run_workers
from benchmarks.sections.durable import remove_headers
from journal.flows import flow, load_state, resume, start
from journal.flows.context import Halt
from journal.flows.ownership import set_ownership
from journal.flows.state import RUNNING
from leases.ownership import install as install_ownership

SNAPSHOT_EVERY = 16
LENGTHS = ((1, 4), (50, 102))  # (completed steps, events in the log while it is running)


class Crash(Halt):
    """The process running the flow dies at the last step: not an error the runner records.
    A Halt (the runtime's own unwinding, let through like a crash): any other BaseException raised by a flow
    or a step (SystemExit) is a failure of that attempt."""

    def __init__(self, message: str = "simulated crash") -> None:
        BaseException.__init__(self, message)
        self.error = self  # what the run stops with: raised to the caller, nothing settles


_crash = {"on": True}
_step_runs = {"count": 0}
_lock = threading.Lock()


@flow("bench.read.held")
def held(ctx, value):
    for i in range(value["n"]):
        ctx.step(f"s{i}", _noop)
    return ctx.step("last", _last)


def _noop() -> int:
    with _lock:
        _step_runs["count"] += 1
    return 1


def _last() -> int:
    if _crash["on"]:
        raise Crash
    return 1


def add_arguments(parser) -> None:
    parser.add_argument("--read-concurrency", type=positive_int, default=16,
                        help="Threads of the read section (default 16).")
    parser.add_argument("--read-ops", type=positive_int, default=300,
                        help="Loads per thread per log length (default 300).")


def running(eid: str, steps: int) -> None:
    """Start the flow and let it die at its last step: a running execution with `steps` recorded."""
    _crash["on"] = True
    try:
        start("bench.read.held", {"n": steps}, execution_id=eid)
    except Crash:
        return
    raise RuntimeError(f"{eid}: the flow was expected to stop at its last step")


def run(ctx) -> None:
    pfx = streams.prefix(ctx.run_id, "read")
    conc, ops = ctx.options["read_concurrency"], ctx.options["read_ops"]
    p50 = {}
    # No lease ownership while the section runs: the "crashed" runs below die inside this process, which
    # would otherwise still count as their live owner (a lazy-lease grace) and refuse the final resume.
    set_ownership(None)
    with override_settings(LOOM_SNAPSHOT_EVERY=SNAPSHOT_EVERY):
        try:
            for steps, events in LENGTHS:
                eid = f"{pfx}{events}"
                running(eid, steps)
                state = load_state(eid)
                ctx.verify(f"{events}-event log: status running", 1, int(state.status == RUNNING))
                ctx.verify(f"{events}-event log length", events - 1, state.seq)
                ctx.verify(f"{events}-event log: completed steps in the state", steps,
                           sum(1 for s in state.steps if s[1] == "completed"))
                p50[events] = _measure(ctx, eid, steps, events, conc, ops)
            ctx.record("long/short p50", {"long": LENGTHS[1][1], "short": LENGTHS[0][1], "status": "running"},
                       throughput=None, unit="ratio",
                       ratio=round(p50[LENGTHS[1][1]] / p50[LENGTHS[0][1]], 3) if p50[LENGTHS[0][1]] else None)
            _resume_all(ctx, pfx)
        finally:
            _crash["on"] = True
            install_ownership()
            if not ctx.options.get("keep"):
                streams.remove(pfx)
                remove_headers(pfx)


def _measure(ctx, eid: str, steps: int, events: int, conc: int, ops: int) -> float | None:
    """N threads load the state `ops` times each, every load's statements and rows counted."""
    tallies: list[tuple[int, int]] = []  # per thread: loads, rows
    lock = threading.Lock()
    local = threading.local()
    bar = ctx.progress(conc * ops, f"{events} events, running")

    def setup(w: int) -> None:
        connection.ensure_connection()  # opened inside the counting window; no statement yet
        local.rows, local.loads = 0, 0

    def op(w: int, i: int, eid=eid, tip=events - 1) -> int:
        state = load_state(eid)
        if state.seq != tip:
            raise RuntimeError(f"{eid}: load_state returned another tip")
        local.rows += (1 if state.snapshot_seq >= 0 else 0) + (state.seq - state.snapshot_seq)
        local.loads += 1
        return 1

    def teardown(w: int) -> None:
        with lock:
            tallies.append((local.loads, local.rows))

    # Every statement of the worker threads' connections, counted at the driver (benchmarks.harness).
    with counting_statements() as counter:
        outcome = run_workers(conc, ops, op, setup=setup, teardown=teardown, progress=bar.update)
    bar.close()
    raise_errors(f"read {events}", outcome.errors)
    loads = sum(t[0] for t in tallies)
    ctx.verify(f"{events}-event loads counted", outcome.units, loads)
    statements, rows = counter.snapshot()[0], sum(t[1] for t in tallies)
    # load_state promises two statements (snapshot, tail) whatever the log length: counted, not assumed.
    ctx.verify(f"{events}-event statements of {loads} loads (two each)", 2 * loads, statements)
    state = load_state(eid)
    result = ctx.record(f"{events}-event", {"events": events, "steps": steps, "status": "running",
                                            "snapshot_every": SNAPSHOT_EVERY, "concurrency": conc},
                        throughput=outcome.throughput, unit="reads/s", latencies_ms=outcome.latencies_ms,
                        count=outcome.units, queries_per_read=round(statements / loads, 3),
                        rows_per_read=round(rows / loads, 3), snapshot_seq=state.snapshot_seq,
                        tail_rows=state.seq - state.snapshot_seq, step_records=len(state.steps))
    return result.p50_ms


def _resume_all(ctx, pfx: str) -> None:
    """Resume both: the recorded steps are replayed, not run again; only the last step runs."""
    _crash["on"] = False
    for _steps, events in LENGTHS:
        before = _step_runs["count"]
        outcome = resume(f"{pfx}{events}")
        ctx.verify(f"{events}-event execution resumed to completion", 1, int(outcome.status == "completed"))
        ctx.verify(f"{events}-event resume: recorded steps run again", 0, _step_runs["count"] - before)
