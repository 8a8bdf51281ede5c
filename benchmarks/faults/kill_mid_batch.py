"""kill-mid-batch: a drain process is SIGKILLed inside a claim's batch, after it applied a random
number of events (its transaction open, its ack not sent), while producers go on committing; a
fresh drain process takes over once the claim's lease window has passed.

Invariants: each projection applied every event exactly once (the killed transaction rolled back
with the ack it never sent), the reaction at least once; no subscription blocked, lagging or claimed."""

from __future__ import annotations

from benchmarks.faults.base import Round, Verdict, acks, drained, finish, settle, streams_of
from benchmarks.faults.processes import wait_until

NAME = "kill-mid-batch"
POSTGRES_ONLY = True
STREAMS = 4
PER = 2


def run(r: Round, points: tuple[str, ...] = ("batch",)) -> Verdict:
    """Kill one drain process at each of `points` in turn (each dies by itself at a random pass of
    its kill point, fixtures.kill_point), then let a survivor finish."""
    producers = 2
    rounds = max(4, r.opt("events") // (STREAMS * PER))
    ticks = producers * STREAMS * rounds * PER
    kills = {point: r.rng.randint(1, max(1, ticks // (2 * len(points)))) for point in points}
    r.params.update(producers=producers, events=ticks, **{f"kill_{p}_after": n for p, n in kills.items()})
    stop = r.folder / "stop"
    with r.pool() as pool:
        env = r.env()
        writers = [pool.role(f"produce-{w}", "produce", {
            "wid": f"w{w}", "streams": streams_of(r, f"w{w}", STREAMS), "rounds": rounds, "per": PER,
            "pause": 0.02}, env) for w in range(producers)]
        died = 0
        for point, after in kills.items():
            victim = pool.role(f"victim-{point}", "consume", {"wid": f"{r.prefix}v-{point}", "stop": str(stop)},
                               r.env(FAULTS_KILL_POINT=point, FAULTS_KILL_AFTER=str(after)))
            if wait_until(lambda v=victim: not v.alive(), f"the {point} victim to die", r.bound, writers):
                died += victim.proc.returncode == -9
            else:
                victim.kill()  # it never reached its kill point (all caught up): kill it from outside
        survivor = pool.role("survivor", "consume", {"wid": f"{r.prefix}survivor", "stop": str(stop)}, env)
        finish(writers, 600)
        caught_up = settle(lambda: drained(r.prefix, 3), r.bound)
        stop.touch()
        finish([survivor], 60)
    verdict = r.verdict
    verdict.journal(r.prefix, acks(writers))
    verdict.projections(r.prefix, exact=("faults-each", "faults-batch"), loose=("faults-loose",))
    verdict.note("died-at-kill-point", died)
    if not caught_up:
        verdict.note("drains-did-not-settle", 1)
    return verdict
