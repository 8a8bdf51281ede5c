"""commit-storm (Act's stress suite): 8 processes commit actions as fast as they can, each on its own
aggregates. Invariants: every stream's seqs contiguous from 0, no duplicate, events stored = the
commits the processes were told succeeded."""

from __future__ import annotations

from benchmarks.faults.base import Round, Verdict, acks, finish

NAME = "commit-storm"
POSTGRES_ONLY = False
AGGREGATES = 4  # per process


def run(r: Round) -> Verdict:
    procs, rounds = r.opt("processes"), max(1, r.opt("events") // AGGREGATES)
    r.params.update(processes=procs, commits=procs * rounds * AGGREGATES)
    go = r.folder / "go"
    local = r.prefix.removeprefix("faults:")  # FaultTally's streams are "faults:<id>"
    with r.pool() as pool:
        env = r.env()
        children = [pool.role(f"commit-{w}", "commit", {
            "wid": f"w{w}", "rounds": rounds, "go": str(go),
            "aggregates": [f"{local}w{w}-a{k}" for k in range(AGGREGATES)]}, env) for w in range(procs)]
        go.touch()
        finish(children, 600)
    verdict = r.verdict
    acked = acks(children)
    verdict.journal(r.prefix, acked)
    extra = verdict.details["events"] - verdict.details["acknowledged"]
    verdict.add("duplicated", "duplicated:stored-not-acknowledged", max(0, extra))
    return verdict
