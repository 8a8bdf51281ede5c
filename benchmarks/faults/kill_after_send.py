"""kill-after-send: a process running flows whose plain step sends a message SIGKILLs itself after the send
committed and before the step was recorded; a `loom_worker` wakes the receivers (they consume the message and
complete) and recovers the senders, whose step runs again and sends the same message id to a receiver that
has completed meanwhile. That send must be the same send (it returns its id, writes nothing): before issue 35
it raised ExecutionFinished and the sender failed.

Invariants: every sender that started completed, its result its message id; every receiver of a started
sender completed with the sender's payload; one message per receiver; no lease left."""

from __future__ import annotations

from benchmarks.faults.base import Round, Verdict
from benchmarks.faults.processes import wait_until
from journal.models import Execution, Message
from leases.store import store_for as lease_store

NAME = "kill-after-send"
POSTGRES_ONLY = True


def _settled(ids: list[str]) -> bool:
    return Execution.objects.filter(id__in=ids, status__in=["completed", "failed", "cancelled", "stuck"]
                                    ).count() == len(ids)


def run(r: Round) -> Verdict:
    n = 2 * r.opt("executions")
    kill_after = r.rng.randint(1, n)
    r.params.update(pairs=n, kill_after_sends=kill_after)
    verdict = r.verdict
    receivers = [f"{r.prefix}recv-{i}" for i in range(n)]
    senders = [f"{r.prefix}send-{i}" for i in range(n)]
    with r.pool() as pool:
        parked = pool.role("receivers", "flows", {"wid": f"{r.prefix}receivers", "ids": receivers,
                                                  "flow": "faults.receiver", "input": {}, "threads": 2}, r.env())
        parked.wait(120)
        worker = pool.worker("worker", f"{r.prefix}worker", r.env())
        worker.ready()
        runner = pool.role("senders", "flows", {"wid": f"{r.prefix}senders", "ids": senders, "flow": "faults.sender",
                                                "input": {}, "threads": 2},
                           r.env(FAULTS_KILL_POINT="sent", FAULTS_KILL_AFTER=str(kill_after)))
        wait_until(lambda: not runner.alive(), "the sender process to die at its kill point", r.bound)
        if runner.alive():
            runner.kill()
        verdict.note("died-at-kill-point", int(runner.proc.returncode == -9))
        started = list(Execution.objects.filter(id__in=senders).values_list("id", flat=True))
        paired = [s.replace(f"{r.prefix}send-", f"{r.prefix}recv-", 1) for s in started]
        wait_until(lambda: _settled(started + paired), "the worker to finish senders and receivers", r.bound,
                   [worker])
        worker.terminate(60)
    rows = {eid: (status, result) for eid, status, result in
            Execution.objects.filter(id__in=started + paired).values_list("id", "status", "result")}
    verdict.add("stuck", "stuck:sender-not-completed", sum(1 for s in started if rows[s][0] != "completed"))
    verdict.add("stuck", "stuck:receiver-not-completed", sum(1 for p in paired if rows[p][0] != "completed"))
    verdict.add("lost", "lost:sender-result-not-its-message-id",
                sum(1 for s in started if rows[s][0] == "completed" and rows[s][1] != f"{s}:go"))
    for receiver in paired:
        count = Message.objects.filter(execution_id=receiver).count()
        verdict.add("duplicated", "duplicated:messages", max(0, count - 1))
        verdict.add("lost", "lost:message", int(count == 0))
    verdict.add("stuck", "stuck:leases-left", lease_store().count_leases(r.prefix))
    verdict.note("senders", len(started))
    return verdict
