"""drain-under-churn (Act's stress suite): 4 processes commit while 4 drain (claim/ack); at a random
moment a rolling deploy replaces the 4 drains by 4 new ones that have one more projection (it starts
from the beginning of streams the other consumers are far along), while the producers go on.

Invariants: seqs contiguous; every acknowledged append stored; each projection applied every event
exactly once, the non-atomic reaction at least once; no subscription blocked, lagging or claimed."""

from __future__ import annotations

from benchmarks.faults.base import Round, Verdict, acks, drained, finish, settle, streams_of
from benchmarks.faults.processes import wait_until

NAME = "drain-under-churn"
POSTGRES_ONLY = True
STREAMS = 6  # per producer
PER = 2  # events per append


def run(r: Round) -> Verdict:
    producers, consumers = 4, 4
    rounds = max(2, r.opt("events") // (STREAMS * PER))
    appends = producers * STREAMS * rounds
    deploy_at = r.rng.randint(appends // 4, appends // 2)
    r.params.update(producers=producers, consumers=consumers, events=appends * PER, late_after_appends=deploy_at)
    stop_old, stop = r.folder / "stop-old", r.folder / "stop"
    with r.pool() as pool:
        env = r.env()
        old = [pool.role(f"drain-{i}", "consume", {"wid": f"{r.prefix}d{i}", "stop": str(stop_old)}, env)
               for i in range(consumers)]
        writers = [pool.role(f"produce-{w}", "produce", {
            "wid": f"w{w}", "streams": streams_of(r, f"w{w}", STREAMS), "rounds": rounds, "per": PER,
            "pause": 0.01}, env) for w in range(producers)]
        wait_until(lambda: len(acks(writers)) >= deploy_at or all(not w.alive() for w in writers),
                   "the producers reach the deploy point", 600, writers + old)
        stop_old.touch()  # the old drains stop (releasing their claims) as the new ones come up
        new = [pool.role(f"drain-new-{i}", "consume", {"wid": f"{r.prefix}n{i}", "stop": str(stop)},
                         r.env(FAULTS_LATE="1")) for i in range(consumers)]
        finish(old, 60)
        finish(writers, 600)
        caught_up = settle(lambda: drained(r.prefix, 4), r.bound)
        stop.touch()
        finish(new, 60)
    verdict = r.verdict
    verdict.journal(r.prefix, acks(writers))
    verdict.projections(r.prefix, exact=("faults-each", "faults-batch", "faults-late"), loose=("faults-loose",))
    if not caught_up:
        verdict.note("drains-did-not-settle", 1)
    return verdict
