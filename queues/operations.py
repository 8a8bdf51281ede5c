"""The operations page's figures (admin: Queues → Operations; `loom workers`), read from the database only, so
every worker on every host is seen as the rows say, never from one process's memory:

- per queue: dispatch (paused or not), running, depth, ready, the oldest pending entry;
- depth over the last hour or day: rebuilt from the entries' own times (an entry was pending at t if it was
  enqueued by t and neither claimed nor finished by t). Finished entries are kept LOOM_QUEUE_RETENTION
  (default a day), so the day's chart is whole with the default retention; a shorter one cuts its left part;
- throughput and failure rate: executions finished per bucket (the headers' finished_at, through the ORM), completed
  against failed;
- workers: the rows not stopped, with their live load: leases held (executions they run now, every kind) and
  queue runs (entries they claimed whose execution has not settled), their drain request if any;
- executions stuck (recovery gave up) or under recovery now (running with an expired lease: a sweep is or will
  be taking them over).

Under LOOM_SHARDS (no `using`) every figure reads every shard and adds them up (entries, headers and leases
live on their execution's shard). Given `unreachable` (the page), a shard that cannot be reached is left out
of every figure and named there (alias -> the error's first line), as queues.stats(unreachable=...); without
it (`loom workers`, tests) its error is raised.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import router
from django.db.models import Count, Min, Q
from django.utils import timezone

import queues as queue_app
from journal import shards
from journal.models import Execution
from leases import drain
from leases.models import Lease, Worker
from queues.models import PENDING, STARTED, Queue, QueueEntry

WINDOWS = {"hour": (timedelta(hours=1), 12), "day": (timedelta(days=1), 24)}  # span, buckets


@dataclass(frozen=True, slots=True)
class QueueRow:
    name: str
    paused: str  # "" when dispatching, else "since <time> by <who>"
    running: int
    concurrency: int
    pending: int
    ready: int
    oldest_pending: datetime | None


@dataclass(frozen=True, slots=True)
class WorkerRow:
    id: str
    role: str
    host: str
    pid: int | None
    seen_at: datetime
    leases: int
    queue_runs: int
    drain: str  # "" or what its drain request says


@dataclass(frozen=True, slots=True)
class Series:
    name: str
    points: list[tuple[datetime, float]]


def _alias(model, using: str | None) -> str:
    return using or router.db_for_read(model)


def _aliases(model, using: str | None) -> list[str]:
    """Where the figures of `model` are read: `using`, else every shard under LOOM_SHARDS (each shard holds its
    executions' entries, headers and leases; the figures are merged), else the model's one database."""
    if using is None and shards.sharded():
        return shards.shards()
    return [_alias(model, using)]


def _on_each(model, using: str | None, unreachable: dict[str, str] | None, read: Callable[[str], object]) -> list:
    """`read(alias)` on each alias of `model` (_aliases), as journal.shards.read_each."""
    return shards.read_each(_aliases(model, using), read, unreachable)


def bucket_edges(window: str, now: datetime | None = None) -> list[datetime]:
    """The bucket ends of a window ("hour": 12 of 5 min; "day": 24 of 1 h), oldest first, the last being now."""
    span, count = WINDOWS[window]
    now = now or timezone.now()
    return [now - span + span * (i + 1) / count for i in range(count)]


def queues(using: str | None = None, unreachable: dict[str, str] | None = None) -> list[QueueRow]:
    stats = {row.name: row for row in queue_app.stats(using, unreachable)}
    oldest: dict[str, datetime] = {}
    declared: dict[str, Queue] = {}

    def read(alias: str) -> tuple[list, list]:
        return (list(QueueEntry.objects.using(alias).filter(state=PENDING).values("queue_id")
                     .annotate(at=Min("enqueued_at")).values_list("queue_id", "at")),
                list(Queue.objects.using(alias).order_by("name")))

    for pending, rows in _on_each(QueueEntry, using, unreachable, read):
        for name, at in pending:
            oldest[name] = min(at, oldest.get(name, at))
        for q in rows:
            declared.setdefault(q.name, q)  # the first shard's row: a declaration and a pause go to every shard
    out = []
    for q in sorted(declared.values(), key=lambda q: q.name):
        row = stats.get(q.name)
        paused = "" if q.paused_at is None else f"since {q.paused_at:%Y-%m-%d %H:%M:%S} by {q.paused_by or '?'}"
        out.append(QueueRow(q.name, paused, row.running if row else 0, q.concurrency, row.pending if row else 0,
                            row.ready if row else 0, oldest.get(q.name)))
    return out


def depth_series(window: str, using: str | None = None, edges: list[datetime] | None = None,
                 unreachable: dict[str, str] | None = None) -> list[Series]:
    """Pending entries per queue at each bucket end (one grouped statement of filtered counts)."""

    edges = edges or bucket_edges(window)
    counts = {f"d{i}": Count("id", filter=Q(enqueued_at__lte=t) & (Q(started_at__isnull=True) | Q(started_at__gt=t))
                             & (Q(finished_at__isnull=True) | Q(finished_at__gt=t)))
              for i, t in enumerate(edges)}
    summed: dict[str, list[int]] = {}

    def read(alias: str) -> list[dict]:
        return list(QueueEntry.objects.using(alias)
                    .filter(Q(finished_at__isnull=True) | Q(finished_at__gte=edges[0]))  # pending at some t >= edges[0]
                    .values("queue_id").annotate(**counts).order_by("queue_id"))

    for r in (r for rows in _on_each(QueueEntry, using, unreachable, read) for r in rows):
        into = summed.setdefault(r["queue_id"], [0] * len(edges))
        for i in range(len(edges)):
            into[i] += r[f"d{i}"]
    return [Series(name, list(zip(edges, summed[name], strict=True))) for name in sorted(summed)]


def throughput_series(window: str, using: str | None = None, edges: list[datetime] | None = None,
                      unreachable: dict[str, str] | None = None) -> tuple[list[Series], list[Series]]:
    """(executions finished per bucket: completed, failed; failure rate in % per bucket with any finished)."""

    edges = edges or bucket_edges(window)
    width = WINDOWS[window][0] / WINDOWS[window][1]
    counts = {}
    for i, t in enumerate(edges):
        inside = Q(finished_at__gt=t - width, finished_at__lte=t)
        counts[f"c{i}"] = Count("id", filter=inside & Q(status="completed"))
        counts[f"f{i}"] = Count("id", filter=inside & Q(status="failed"))
    row = dict.fromkeys(counts, 0)
    for found in _on_each(Execution, using, unreachable, lambda alias: Execution.objects.using(alias).filter(
            finished_at__gt=edges[0] - width).aggregate(**counts)):
        row = {key: row[key] + (found[key] or 0) for key in counts}
    done = [Series("completed", [(t, row[f"c{i}"]) for i, t in enumerate(edges)]),
            Series("failed", [(t, row[f"f{i}"]) for i, t in enumerate(edges)])]
    rate = [Series("failure rate %", [(t, 100.0 * row[f"f{i}"] / (row[f"c{i}"] + row[f"f{i}"]))
                                      for i, t in enumerate(edges) if row[f"c{i}"] + row[f"f{i}"]])]
    return done, rate


def workers(using: str | None = None, unreachable: dict[str, str] | None = None) -> list[WorkerRow]:
    rows = list(Worker.objects.using(_alias(Worker, using)).filter(stopped_at__isnull=True).order_by("id"))
    ids = [w.id for w in rows]
    leases: dict[str, int] = {}
    runs: dict[str, int] = {}

    def read(alias: str) -> tuple[list, list]:  # a worker holds leases and runs entries on every shard
        return (list(Lease.objects.using(alias).filter(owner_id__in=ids).values("owner_id")
                     .annotate(n=Count("execution_id")).values_list("owner_id", "n")),
                list(QueueEntry.objects.using(alias).filter(state=STARTED, worker__in=ids)
                     .exclude(execution_id__in=_settled_ids(alias)).values("worker").annotate(n=Count("id"))
                     .values_list("worker", "n")))

    for held, running in _on_each(Lease, using, unreachable, read):
        for owner, n in held:
            leases[owner] = leases.get(owner, 0) + n
        for worker, n in running:
            runs[worker] = runs.get(worker, 0) + n
    drains = drain.state(ids, using)
    out = []
    for w in rows:
        found = drains.get(w.id)
        said = ""
        if found is not None:
            _asked, by, seen, done = found
            said = ("drained" if done else "draining" if seen else "asked") + f" (by {by or '?'})"
        out.append(WorkerRow(w.id, w.role, w.host, w.pid, w.seen_at, leases.get(w.id, 0), runs.get(w.id, 0), said))
    return out


def _settled_ids(using: str | None):
    return Execution.objects.using(_alias(Execution, using)).filter(
        status__in=("completed", "failed", "cancelled")).values("id")


def troubled(using: str | None = None, limit: int = 50, unreachable: dict[str, str] | None = None
             ) -> list[tuple[str, str, str, str]]:
    """Executions stuck, or running with an expired lease (under recovery now): (id, flow, status, why)."""

    now = timezone.now()

    def read(alias: str) -> list:  # an execution's lease row is on its own shard
        expired = Lease.objects.using(alias).filter(expires_at__lt=now).values("execution_id")
        return list(Execution.objects.using(alias).filter(Q(status="stuck") | Q(status="running", id__in=expired))
                    .order_by("-updated_at").values_list("updated_at", "id", "flow", "status")[:limit])

    rows = [row for found in _on_each(Execution, using, unreachable, read) for row in found]
    rows.sort(key=lambda row: row[0], reverse=True)
    return [(eid, flow, status, "recovery gave up" if status == "stuck" else "lease expired: being recovered")
            for _, eid, flow, status in rows[:limit]]
