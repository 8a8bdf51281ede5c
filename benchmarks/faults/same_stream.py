"""same-stream (Act's stress suite): 8 processes run an action on ONE aggregate with `do_with_retry`.
Invariants: seqs contiguous, no two commits at one version, and every command eventually commits
(a command that exhausts its attempts is starved: counted as stuck). The conflicts and the worst caller's
attempts (the most one commit needed) are recorded with the round and printed."""

from __future__ import annotations

from benchmarks.faults.base import Round, Verdict, acks, finish

NAME = "same-stream"
POSTGRES_ONLY = False


def run(r: Round) -> Verdict:
    procs, commits = r.opt("processes"), max(1, r.opt("events") // 10)
    r.params.update(processes=procs, commits=procs * commits, attempts=r.opt("attempts"))
    go = r.folder / "go"
    aggregate = r.prefix.removeprefix("faults:") + "hot"
    with r.pool() as pool:
        env = r.env()
        children = [pool.role(f"contend-{w}", "contend", {
            "wid": f"w{w}", "aggregate": aggregate, "commits": commits, "attempts": r.opt("attempts"),
            "go": str(go)}, env) for w in range(procs)]
        go.touch()
        finish(children, 600)
    verdict = r.verdict
    acked = acks(children)
    verdict.journal(r.prefix, acked)
    verdict.add("stuck", "stuck:starved-commands", sum(len(c.said("EXHAUSTED")) for c in children))
    extra = verdict.details["events"] - verdict.details["acknowledged"]
    verdict.add("duplicated", "duplicated:stored-not-acknowledged", max(0, extra))
    versions = [seq for _, seq, _ in acked]
    verdict.add("duplicated", "duplicated:same-version-acknowledged-twice", len(versions) - len(set(versions)))
    verdict.note("conflicts", sum(int(p[1]) for c in children for p in c.said("CONFLICTS")))  # recorded
    # Recorded with the round and printed: the most attempts one caller's commit took (conflicts: printed too).
    r.figures["lost_races"] = verdict.details["conflicts"]
    r.figures["worst_attempts"] = max((int(p[1]) for c in children for p in c.said("WORST")), default=0)
    return verdict
