"""failover: the primary of a pg_auto_failover formation (`scripts/ha-servers`) lost twice per round
(`--failovers`), its keeper and postmaster SIGKILLed, the synchronous standby promoted by the monitor, while
producers append, a process starts durable flows, queued executions wait on a queue and a `loom_worker` runs them,
drains the projections and recovers flows. After each failover the lost node rejoins as the new standby (so that the
second failover, too, has a synchronous standby to promote).

Runs only when the database under test is the formation's (DATABASE_URL a multi-host DSN naming its nodes, from
`scripts/ha-servers uri DBNAME`), as root, with the formation up; otherwise skipped with the reason (under
CI=true that is a failure: .ci/run starts the formation). Everyone reconnects by themselves through the DSN's
`target_session_attrs=read-write`: producers and the starter say an append or start in flight DOUBT/ERROR
(DatabaseUnavailable: in doubt, neither counted acknowledged nor expected) and go on; the worker gets no help.

Invariants: every acknowledged append stored on the new primary, seqs contiguous, nothing written twice; every
execution (started or queued) completes with each step's effect once; each projection applied every event
exactly once; after each failover no lease of a running execution left expired for more than a TTL (the
database's clock: nobody renewed it and no sweep took it over); no lease or claim left, the worker alive.
Figures: promotion and rejoin seconds, and the recovery time of writes: from the SIGKILL (the producers append
every 30 ms, so the last acknowledged append is at most that much earlier) to the first append acknowledged
after it (polled every 20 ms)."""

from __future__ import annotations

import contextlib
import json
import os
import time

from django.db import connection, connections

from benchmarks.faults import ha
from benchmarks.faults.base import Round, Verdict, acks, drained, finish, settle, streams_of
from benchmarks.faults.processes import TTL, wait_until
from journal.models import Execution

NAME = "failover"
POSTGRES_ONLY = True
STREAMS = 3
QUEUE = "faults-failover"
STEP_PAUSE = 0.5  # seconds a step takes: runs, queued or started, are mid-way when the primary dies


def cannot_run(options: dict) -> str | None:
    """Why this machine cannot fail the database under test over, or None."""
    if connection.vendor != "postgresql":
        return "needs PostgreSQL"
    ports = {int(p) for p in str(connection.settings_dict.get("PORT") or "").split(",") if p.strip().isdigit()}
    if not set(ha.NODE_PORTS) <= ports:
        return (f"the database is not on the HA formation (give DATABASE_URL=$(scripts/ha-servers uri DBNAME), "
                f"nodes {', '.join(map(str, ha.NODE_PORTS))})")
    problem = ha.problem()
    if problem and os.environ.get("CI") == "true":
        return None  # under CI a formation that is not there fails the round (run says why): .ci/run starts it
    return problem


def _reconnect() -> None:
    for conn in connections.all(initialized_only=True):
        with contextlib.suppress(Exception):
            conn.close()


def _with_retry(query, what: str, timeout: float = 60.0):
    """This process's own reads after a failover: its sessions died with the old primary; reconnect and retry."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return query()
        except Exception:
            _reconnect()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _first_ack_after(writers, failover: ha.Failover) -> float:
    """Seconds from the SIGKILL to the first append acknowledged by the new primary (polled every 20 ms). The
    acks counted when the promotion is seen are all from before the kill: nothing commits with no primary."""
    before = len(acks(writers))
    while len(acks(writers)) == before and any(w.alive() for w in writers):
        time.sleep(0.02)
    return round(time.monotonic() - failover.killed_at, 3)


def run(r: Round) -> Verdict:
    from leases.store import store_for as lease_store
    from queues import declare_queue, enqueue
    from queues.declarations import forget

    problem = ha.problem()
    if problem:
        raise AssertionError(f"CI=true and the HA formation is missing: {problem}")
    producers, n, steps, failovers = 2, r.opt("executions"), r.opt("steps"), int(r.options.get("failovers") or 2)
    # The load runs until told to stop (a stop file): each failover is at a random count of appends of the first
    # producer counted from the previous one's rejoin, so that every failover happens under load.
    base = max(6, r.opt("events") // STREAMS)
    kill_after = [r.rng.randint(base, 2 * base) for _ in range(failovers)]
    stop = r.folder / "stop"
    ids = [f"{r.prefix}x{i}" for i in range(n)]
    queued = [f"{r.prefix}q{i}" for i in range(n)]
    r.params.update(producers=producers, executions=n, queued=n, steps=steps, failovers=failovers,
                    fail_after_appends=kill_after)
    verdict = r.verdict
    declare_queue(QUEUE, concurrency=2)
    try:
        for eid in queued:  # waiting on the queue before the first failover; some claimed by the time of it
            enqueue("faults.steps", {"n": steps, "pause": STEP_PAUSE}, queue=QUEUE, execution_id=eid)
        with r.pool() as pool:
            env = r.env(LOOM_QUEUES=json.dumps({QUEUE: {"concurrency": 2}}), LOOM_QUEUE_THREADS="2",
                        LOOM_QUEUE_POLL="0.05", LOOM_RECOVERY_PATIENCE="60")
            worker = pool.worker("worker", f"{r.prefix}worker", env)
            writers = [pool.role(f"produce-{w}", "produce", {
                "wid": f"w{w}", "streams": streams_of(r, f"w{w}", STREAMS), "rounds": 100_000, "per": 1,
                "pause": 0.03, "tolerant": True, "stop": str(stop)}, env) for w in range(producers)]
            starter = pool.role("starter", "flows", {"wid": f"{r.prefix}starter", "ids": ids, "flow": "faults.steps",
                                                     "input": {"n": steps, "pause": STEP_PAUSE}, "threads": 1,
                                                     "pause": 6.0 * failovers / max(1, n), "tolerant": True}, env)
            worker.ready()
            wait_until(lambda: starter.said("READY"), "the flow starter to come up", 120, [*writers, starter])
            rejoining: tuple | None = None
            for k, after in enumerate(kill_after):
                if rejoining:  # the previous failover's lost node must be the standby again before the next
                    ha.rejoined(*rejoining)
                    r.figures[f"rejoined_seconds_{k}"] = rejoining[0].rejoined_seconds
                at = len(acks(writers[:1])) + after
                if not wait_until(lambda at=at: len(acks(writers[:1])) >= at, "the load", 120, [*writers, starter]):
                    raise AssertionError(f"the producers stopped acknowledging before failover {k + 1}")
                failover = ha.kill_primary()
                r.figures[f"promoted_seconds_{k + 1}"] = failover.promoted_seconds
                r.figures[f"write_recovery_seconds_{k + 1}"] = _first_ack_after(writers, failover)
                rejoining = (failover, ha.rejoin(failover, wait=False))  # meanwhile: the load goes on
                # A TTL (and a sweep) after the promotion, every running execution's lease was renewed or taken.
                time.sleep(2 * TTL + 0.5)
                _reconnect()
                verdict.add("stuck", "stuck:lease-expired-past-ttl", _with_retry(
                    lambda: lease_store().count_leases_expired_for(r.prefix, TTL), "the lease count"))
            stop.touch()
            finish([*writers, starter], 600)
            _reconnect()
            t0 = time.monotonic()
            existing = _with_retry(lambda: list(Execution.objects.filter(id__in=ids).values_list("id", flat=True)),
                                   "the executions")
            caught_up = settle(lambda: drained(r.prefix, 3) and Execution.objects.filter(
                id__in=existing + queued, status="completed").count() == len(existing) + len(queued), r.bound)
            r.figures["settled_seconds"] = round(time.monotonic() - t0, 2)
            if rejoining and r.options.get("failover_rejoin") != "background":
                ha.rejoined(*rejoining)  # it ran while the round settled; waited for so that the formation is whole
                r.figures[f"rejoined_seconds_{len(kill_after)}"] = rejoining[0].rejoined_seconds
            verdict.add("stuck", "stuck:worker-died", int(not worker.alive()))
            if worker.alive():
                worker.terminate(60)
    finally:
        _reconnect()
        _with_retry(lambda: forget(QUEUE), "the queue")
    verdict.journal(r.prefix, acks(writers))
    verdict.projections(r.prefix, exact=("faults-each", "faults-batch"), loose=("faults-loose",))
    verdict.executions(r.prefix, existing + queued, steps)
    verdict.note("appends-in-doubt", sum(len(w.said("DOUBT")) for w in writers))
    verdict.note("starts-in-doubt", len(starter.said("ERROR")))
    if not caught_up:
        verdict.note("did-not-settle", 1)
    return verdict


