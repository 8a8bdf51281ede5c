"""The child processes of the fault scenarios: `python -c "...; main()" ROLE JSON`.

Each role writes one line per thing it was told succeeded (an acknowledged append, a committed
action, an execution's outcome) to its stdout, flushed at once, which the scenario redirects to a
file: a child killed at any moment leaves behind exactly what it was acknowledged, and the parent
compares that with the database. Roles never hide a failure: an error the role cannot tolerate ends
it with a traceback and a non-zero exit.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable

from django.db import connections

RECONNECT_PAUSE = 0.2


def say(*parts) -> None:
    print(*parts, flush=True)


def _wait_for(path: str | None) -> None:
    while path and not os.path.exists(path):
        time.sleep(0.005)


def _reconnect() -> None:
    """After an error that may have broken the connection (a server restart): drop it, so that the
    next query opens a new one. Django does this per request; a long-running process must do it."""
    for conn in connections.all(initialized_only=True):
        with contextlib.suppress(Exception):
            conn.close()
    time.sleep(RECONNECT_PAUSE)


def produce(args: dict) -> None:
    """Append `FaultTick` events to `streams`, `rounds` times each, `per` events an append.

    tolerant: an append that raises is in doubt (the server may have committed it before the
    connection broke): say DOUBT, reconnect and go on. Otherwise any error ends the child. Given `stop` (a file),
    the child ends early once it exists (a scenario that needs load for as long as it runs)."""
    from benchmarks.faults.fixtures import TYPE
    from journal.envelopes import Envelope
    from journal.models import Event

    _wait_for(args.get("go"))
    n = 0
    for _r in range(args["rounds"]):
        if args.get("stop") and os.path.exists(args["stop"]):
            break
        for stream in args["streams"]:
            envelopes = [Envelope(TYPE, {"w": args["wid"], "n": n + k}) for k in range(args["per"])]
            try:
                done = Event.objects.append(stream, envelopes)
            except Exception as exc:
                if not args.get("tolerant"):
                    raise
                say("DOUBT", stream, type(exc).__name__)
                _reconnect()
                continue
            finally:
                n += args["per"]
            say("ACK", stream, done.first_seq, done.last_seq)
        if args.get("pause"):
            time.sleep(args["pause"])
    say("DONE")


def commit(args: dict) -> None:
    """Run the `count` action of aggregate FaultTally on its own aggregates (commit-storm): every
    commit is said; a lost race is an error (nobody else writes these streams)."""
    from benchmarks.faults.fixtures import count
    from journal.aggregates import do

    _wait_for(args.get("go"))
    for _ in range(args["rounds"]):
        for aggregate in args["aggregates"]:
            done = do(count, aggregate, {"who": args["wid"]})
            say("ACK", done.stream, done.version, done.version)
    say("DONE")


def contend(args: dict) -> None:
    """Every process runs `count` on ONE aggregate with do_with_retry (same-stream contention)."""
    from benchmarks.faults.fixtures import count
    from journal.aggregates import RetriesExhausted, do_with_retry

    conflicts = worst = 0
    call = [0]  # races the current call lost

    def lost(attempt, error) -> None:
        nonlocal conflicts
        conflicts += 1
        call[0] = attempt

    _wait_for(args.get("go"))
    for _ in range(args["commits"]):
        call[0] = 0
        try:
            done = do_with_retry(count, args["aggregate"], {"who": args["wid"]}, attempts=args["attempts"],
                                 on_conflict=lost)
            say("ACK", done.stream, done.version, done.version)
            worst = max(worst, call[0] + 1)  # the attempt that committed
        except RetriesExhausted:
            say("EXHAUSTED")
            worst = max(worst, call[0])
    say("CONFLICTS", conflicts)
    say("WORST", worst)  # the most attempts one call of this process needed
    say("DONE")


def consume(args: dict) -> None:
    """A drain node (projections' DrainService) until the `stop` file exists."""
    from projections.service import DrainService

    class Node:
        worker_id = args["wid"]

    service = DrainService()
    service.start(Node())
    say("READY")
    _wait_for(args["stop"])
    service.stop(10)
    say("HANDLED", service.handled)
    say("DONE")


def flows(args: dict) -> None:
    """Start the executions `ids` of flow `flow` on `threads` threads, with this process's lease keeper.

    tolerant: a start that raises is said as ERROR (the worker's recovery must finish it), the
    connection is dropped and the thread goes on with its next id."""
    from journal.flows import start
    from leases.worker import HeartbeatService, Worker

    node = Worker(args["wid"], services=[HeartbeatService])
    node.start()
    say("READY")
    ids = list(args["ids"])
    lock = threading.Lock()
    _wait_for(args.get("go"))

    def run() -> None:
        while True:
            with lock:
                if not ids:
                    break
                eid = ids.pop(0)
            try:
                outcome = start(args["flow"], args["input"], execution_id=eid)
                say("OUTCOME", eid, outcome.status)
            except Exception as exc:
                if not args.get("tolerant"):
                    raise
                say("ERROR", eid, type(exc).__name__)
                _reconnect()
            if args.get("pause"):
                time.sleep(args["pause"])
        connections.close_all()

    threads = [threading.Thread(target=run) for _ in range(args["threads"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    node.stop(5)
    say("DONE")


def hold(args: dict) -> None:
    """The zombie: run one execution with an eager lease and only a heartbeat (no recovery of its
    own); when it wakes from SIGSTOP, try a late append with its first fence token."""
    from journal.envelopes import Envelope
    from journal.exceptions import StaleFence
    from journal.flows import start
    from journal.models import Event
    from leases.worker import HeartbeatService, Worker

    node = Worker(args["wid"], services=[HeartbeatService])
    node.start()
    try:
        say("OUTCOME", args["id"], start("faults.paused", args["input"], execution_id=args["id"]).status)
    except Exception as exc:
        say("HALTED", type(exc).__name__)
    try:
        Event.objects.append(args["id"], Envelope("LATE_WRITE"), fence_token=1)
        say("LATE", "APPENDED")
    except StaleFence:
        say("LATE", "REFUSED")
    node.stop(5)
    say("DONE")


ROLES: dict[str, Callable[[dict], None]] = {
    "produce": produce, "commit": commit, "contend": contend, "consume": consume, "flows": flows, "hold": hold,
}


def main() -> None:
    role, args = sys.argv[1], json.loads(sys.argv[2])
    ROLES[role](args)
