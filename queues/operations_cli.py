"""The `loom` command's operating verbs (docs/cli.md): pause/resume a queue, drain a worker, and a schedule's run
now, pause, resume and backfill. Each says what it did, and refuses (exit 1, nothing written) what it cannot do.
The same functions as the admin's actions (queues/pause.py, leases/drain.py, leases/schedule_ops.py)."""

from __future__ import annotations

from journal.cli import USAGE, Refused, Reply, acting, parse_since


def _need(value: str | None, what: str) -> str:
    if not value:
        raise Refused(f"name the {what}", USAGE)
    return value


@acting
def queue_action(using: str | None, action: str, name: str | None) -> Reply:
    from queues import pause

    name = _need(name, "queue")
    out = pause.pause(name, "loom CLI", using) if action == "pause" else pause.resume(name, using)
    verb = "paused" if action == "pause" else "resumed"
    said = verb if out.changed else ("already paused" if action == "pause" else "was not paused")
    return Reply({"queue": name, "paused": out.paused, "changed": out.changed}, [f"queue {name}: {said}"])


@acting
def workers(using: str | None) -> Reply:
    """Every worker row that has not stopped, with its live load (queues/operations.py)."""
    from queues import operations

    rows = operations.workers(using)
    data = [{"id": w.id, "role": w.role, "host": w.host, "pid": w.pid, "seen_at": w.seen_at.isoformat(),
             "leases": w.leases, "queue_runs": w.queue_runs, "drain": w.drain} for w in rows]
    lines = [f"{'worker':40} {'role':10} {'leases':>6} {'queue runs':>10}  drain"]
    lines += [f"{w.id:40} {w.role:10} {w.leases:>6} {w.queue_runs:>10}  {w.drain or '-'}" for w in rows]
    return Reply(data, lines if rows else ["no running workers"])


@acting
def drain(using: str | None, worker_id: str | None) -> Reply:
    from leases import drain as drains

    try:
        out = drains.request(_need(worker_id, "worker"), "loom CLI", using)
    except drains.UnknownWorker as exc:
        raise Refused(str(exc), kind="UnknownWorker") from None
    said = "asked to drain" if out.new else "already asked to drain"
    return Reply({"worker": out.worker_id, "new": out.new},
                 [f"worker {out.worker_id}: {said}; it finishes its runs and exits (watch `loom workers`)"])


@acting
def schedule_action(using: str | None, action: str, name: str | None, start: str | None = None,
                    end: str | None = None) -> Reply:
    from leases import schedule_ops as ops

    name = _need(name, "schedule")
    if action == "run-now":
        eid = ops.run_now(name, "loom CLI", using)
        return Reply({"schedule": name, "execution_id": eid}, [f"schedule {name}: queued {eid}"])
    if action in ("pause", "resume"):
        changed = ops.pause(name, "loom CLI", using) if action == "pause" else ops.resume(name, using)
        said = {"pause": ("paused", "already paused"), "resume": ("resumed", "was not paused")}[action][not changed]
        return Reply({"schedule": name, "paused": action == "pause", "changed": changed},
                     [f"schedule {name}: {said}"])
    if not start or not end:
        raise Refused("backfill needs --from and --to (ISO times, UTC unless they say otherwise, or ages: 2h)", USAGE)
    done = ops.backfill(name, parse_since(start), parse_since(end), "loom CLI", using)
    return Reply({"schedule": name, "started": done.started, "already": done.already},
                 [f"schedule {name}: backfill queued {len(done.started)} tick(s), {len(done.already)} already "
                  "started"] + [f"  {eid}" for eid in done.started])
