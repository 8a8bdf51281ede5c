"""The queues app's part of `manage.py loom` (docs/cli.md): the `queues` noun (list; pause or resume one) and the
`workers` noun (list; drain one), and what the execution verbs learn from this app (an execution's queue entry,
the `--queue` filter, cancelling an entry before it starts, QueueError as a refusal). `register()` adds them
through journal/cli.py's seams, from QueuesConfig.ready(). The operating verbs say what they did and refuse
(exit 1, nothing written) what they cannot do; they are the admin's actions (queues/pause.py, leases/drain.py)."""

from __future__ import annotations

from journal import cli
from journal.cli import USAGE, Refused, Reply, acting, iso, options, table
from leases import drain as drains
from queues import operations, pause, stats
from queues.exceptions import QueueError
from queues.models import QueueEntry
from queues.store import store_for


def _need(value: str | None, what: str) -> str:
    if not value:
        raise Refused(f"name the {what}", USAGE)
    return value


# -- loom queues [list | pause NAME | resume NAME] -------------------------------------------------------------
def queue_arguments(parser) -> None:
    options(parser)
    parser.add_argument("action", nargs="?", default="list", choices=["list", "pause", "resume"])
    parser.add_argument("name", nargs="?", metavar="QUEUE")


def queue_dispatch(parsed: dict, using: str | None) -> Reply:
    if parsed["action"] == "list":
        return queues(using)
    return queue_action(using, parsed["action"], parsed["name"])


def queues(using: str | None) -> Reply:
    """Every queue: caps, depth and running count (the queues app's stats; with LOOM_SHARDS and no alias,
    every shard's counts added up, the caps each shard's)."""
    held = pause.paused(using)  # queue -> (since, by): `loom queues pause` (docs/queues.md "Pausing a queue")
    data = [{"name": q.name, "concurrency": q.concurrency, "partition_concurrency": q.partition_concurrency,
             "rate_limit": q.rate_limit, "rate_period": q.rate_period, "pending": q.pending, "ready": q.ready,
             "running": q.running, "paused_since": iso(held[q.name][0]) if q.name in held else None,
             "paused_by": held[q.name][1] if q.name in held else None} for q in stats(using)]
    lines = table(["queue", "running", "cap", "pending", "ready", "per partition", "rate", "dispatch"],
                  [[q["name"], q["running"], q["concurrency"], q["pending"], q["ready"],
                    q["partition_concurrency"] or "-",
                    f"{q['rate_limit']}/{q['rate_period']:g}s" if q["rate_limit"] else "-",
                    f"paused by {q['paused_by'] or '?'}" if q["paused_since"] else "running"] for q in data])
    return Reply(data, lines or ["no queues"])


@acting
def queue_action(using: str | None, action: str, name: str | None) -> Reply:
    name = _need(name, "queue")
    out = pause.pause(name, "loom CLI", using) if action == "pause" else pause.resume(name, using)
    verb = "paused" if action == "pause" else "resumed"
    said = verb if out.changed else ("already paused" if action == "pause" else "was not paused")
    return Reply({"queue": name, "paused": out.paused, "changed": out.changed}, [f"queue {name}: {said}"])


# -- loom workers [list | drain WORKER_ID] ----------------------------------------------------------------------
def worker_arguments(parser) -> None:
    options(parser)
    parser.add_argument("action", nargs="?", default="list", choices=["list", "drain"])
    parser.add_argument("name", nargs="?", metavar="WORKER_ID")


def worker_dispatch(parsed: dict, using: str | None) -> Reply:
    if parsed["action"] == "list":
        return workers(using)
    return drain(using, parsed["name"])


@acting
def workers(using: str | None) -> Reply:
    """Every worker row that has not stopped, with its live load (queues/operations.py)."""
    rows = operations.workers(using)
    data = [{"id": w.id, "role": w.role, "host": w.host, "pid": w.pid, "seen_at": w.seen_at.isoformat(),
             "leases": w.leases, "queue_runs": w.queue_runs, "drain": w.drain} for w in rows]
    lines = [f"{'worker':40} {'role':10} {'leases':>6} {'queue runs':>10}  drain"]
    lines += [f"{w.id:40} {w.role:10} {w.leases:>6} {w.queue_runs:>10}  {w.drain or '-'}" for w in rows]
    return Reply(data, lines if rows else ["no running workers"])


@acting
def drain(using: str | None, worker_id: str | None) -> Reply:
    try:
        out = drains.request(_need(worker_id, "worker"), "loom CLI", using)
    except drains.UnknownWorker as exc:
        raise Refused(str(exc), kind="UnknownWorker") from None
    said = "asked to drain" if out.new else "already asked to drain"
    return Reply({"worker": out.worker_id, "new": out.new},
                 [f"worker {out.worker_id}: {said}; it finishes its runs and exits (watch `loom workers`)"])


# -- what the execution verbs learn from this app ------------------------------------------------------------------
def queue_entry(using: str, execution_id: str) -> dict | None:
    """An execution's queue entry for `executions show` (None: it has none)."""
    entry = QueueEntry.objects.using(using).filter(execution_id=execution_id).first()
    if entry is None:
        return None
    return {"queue": entry.queue_id, "state": entry.state, "priority": entry.priority,
            "partition_key": entry.partition_key or None, "enqueued_at": iso(entry.enqueued_at)}


def queued_ids(using: str, queue: str):
    """The execution ids of one queue's entries, a subquery for `executions list --queue`."""
    return QueueEntry.objects.using(using).filter(queue_id=queue).values("execution_id")


def cancel_pending(using: str, execution_id: str) -> bool:
    """Cancel a pending entry written before queued executions (its execution has no header yet)."""
    return store_for(using).cancel_pending(execution_id)


def register() -> None:
    """Add the queues app's nouns and parts to `manage.py loom` (QueuesConfig.ready())."""
    cli.add_cli_noun("queues", queue_arguments, queue_dispatch, place=20,
                     help="Queues: running, cap, depth; pause or resume one.")
    cli.add_cli_noun("workers", worker_arguments, worker_dispatch, place=30,
                     help="Running workers and their load; drain one.")
    cli.add_cli_part(queue_entry=queue_entry, queued_ids=queued_ids, cancel_pending=cancel_pending,
                     refusals=(QueueError,))
