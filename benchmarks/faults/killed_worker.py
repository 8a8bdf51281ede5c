"""killed-worker (Act's stress suite): 6 processes commit and 2 drain; 2 of the committing processes
are SIGKILLed mid-commit and one drain process is SIGKILLed mid-cycle and replaced, at random moments.

Invariants: seqs contiguous; everything the killed processes were told was stored is stored; the
survivors finish cleanly; each projection applied every event exactly once (the reaction at least
once); no subscription blocked, lagging or claimed after the drain lease window."""

from __future__ import annotations

from benchmarks.faults.base import Round, Verdict, acks, drained, finish, settle, streams_of
from benchmarks.faults.processes import wait_until

NAME = "killed-worker"
POSTGRES_ONLY = True
STREAMS = 4
PER = 2


def run(r: Round) -> Verdict:
    producers, victims = 6, 2
    rounds = max(4, r.opt("events") // (STREAMS * PER))
    per_producer = STREAMS * rounds
    kill_after = sorted(r.rng.randint(1, per_producer - 1) for _ in range(victims))
    drain_kill_after = r.rng.randint(per_producer // 4, per_producer)
    r.params.update(producers=producers, killed=victims, kill_after_appends=kill_after,
                    drain_killed_after_appends=drain_kill_after)
    stop = r.folder / "stop"
    with r.pool() as pool:
        env = r.env()
        drains = [pool.role(f"drain-{i}", "consume", {"wid": f"{r.prefix}d{i}", "stop": str(stop)}, env)
                  for i in range(2)]
        writers = [pool.role(f"produce-{w}", "produce", {
            "wid": f"w{w}", "streams": streams_of(r, f"w{w}", STREAMS), "rounds": rounds, "per": PER,
            "pause": 0.01}, env) for w in range(producers)]
        doomed, survivors = writers[:victims], writers[victims:]
        pending = [*list(zip(kill_after, doomed, strict=True)), (drain_kill_after, drains[0])]
        pending.sort(key=lambda item: item[0])
        for threshold, victim in pending:
            clock = victim if victim in doomed else writers[-1]  # a producer dies after its own n-th append
            wait_until(lambda t=threshold, c=clock: len(acks([c])) >= t or not c.alive(),
                       f"the moment to kill {victim.name}", 600, survivors)
            victim.kill()
        drains.append(pool.role("drain-2", "consume", {"wid": f"{r.prefix}d2", "stop": str(stop)}, env))
        finish(survivors, 600)
        caught_up = settle(lambda: drained(r.prefix, 3), r.bound)
        stop.touch()
        finish(drains[1:], 60)
    verdict = r.verdict
    verdict.journal(r.prefix, acks(writers))
    verdict.projections(r.prefix, exact=("faults-each", "faults-batch"), loose=("faults-loose",))
    verdict.add("stuck", "stuck:survivor-unfinished", sum(1 for w in survivors if not w.said("DONE")))
    if not caught_up:
        verdict.note("drains-did-not-settle", 1)
    return verdict
