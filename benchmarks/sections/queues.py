"""Section `queues`: queues with real worker processes, and Django tasks beside django-tasks-db.

Scenarios (each with its own queue and id prefix; entries are queued first, then the workers start,
so enqueueing is not measured; rates run from the first execution's start to the last one's end,
read from the journal's headers):

- **cap**: `--queue-execs` one-step executions through a queue capped at `--queue-cap` with
  `--queue-workers` loom_worker processes (LOOM_QUEUE_THREADS = the cap, so either worker could fill
  it alone). Executions/s, and the most executions running at once, sampled every 10 ms from the
  journal's headers (never more than the cap, or the run fails verification).
- **partitions**: `--queue-partition-execs` executions over `--queue-partitions` partition keys with a
  per-partition cap of 1 (global cap as above): executions/s and the most running in any one
  partition (sampled every 10 ms; at most 1).
- **rate**: a rate limit of `--queue-rate` starts per `--queue-rate-period` seconds over three periods'
  worth of entries: the most starts in any window of one period (at most the limit) and the rate
  achieved, starts per period between the first and the last.
- **tasks**: Django tasks through queues.tasks.LoomBackend, then the same through django-tasks-db
  (`DatabaseBackend`, its `db_worker`), each with `--queue-workers` processes running one task at a
  time and polling every `--queue-poll` s: tasks/s over a backlog of `--queue-task-execs`, and
  enqueue->start latency of `--queue-latency-tasks` tasks enqueued one every 100 ms to idle workers
  (p50/p99). django-tasks-db missing (an optional extra): one line says so and only ours runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path

from django.apps import apps
from django.db import connection

from benchmarks.arguments import positive_float, positive_int
from benchmarks.faults.processes import ROOT, child_env
from journal.flows import flow
from journal.models import Execution
from journal.store import store_for as journal_store
from queues import enqueue
from queues.declarations import declare_queue, forget
from queues.models import QueueEntry
from queues.store import store_for as queue_store

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task


@flow("bench.queue.one")
def one_step(ctx, value):
    return ctx.step("one", _one)


def _one() -> int:
    return 1


@task
def bench_task(n: int) -> int:
    return n


def add_arguments(parser) -> None:
    parser.add_argument("--queue-execs", type=positive_int, default=10_000,
                        help="Executions through the capped queue (default 10,000).")
    parser.add_argument("--queue-cap", type=positive_int, default=8, help="The queue's concurrency cap (8).")
    parser.add_argument("--queue-workers", type=positive_int, default=2, help="loom_worker processes (2).")
    parser.add_argument("--queue-partitions", type=positive_int, default=100, help="Partition keys (100).")
    parser.add_argument("--queue-partition-execs", type=positive_int, default=2_000,
                        help="Executions of the partition scenario (2,000).")
    parser.add_argument("--queue-rate", type=positive_int, default=50, help="Rate limit: starts per period (50).")
    parser.add_argument("--queue-rate-period", type=positive_float, default=1.0, help="Rate period, seconds (1).")
    parser.add_argument("--queue-task-execs", type=positive_int, default=1_000,
                        help="Tasks of the tasks/s backlog, per backend (1,000).")
    parser.add_argument("--queue-latency-tasks", type=positive_int, default=100,
                        help="Tasks of the enqueue->start latency trickle, per backend (100).")
    parser.add_argument("--queue-poll", type=positive_float, default=0.1,
                        help="Seconds an idle worker waits before polling again, both backends (0.1).")


class Sampler(threading.Thread):
    """Calls `probe` every 10 ms in its own thread (its own connection); keeps the samples."""

    def __init__(self, probe):
        super().__init__(daemon=True)
        self.probe, self.samples, self.stopping = probe, [], threading.Event()

    def run(self) -> None:
        try:
            while not self.stopping.wait(0.01):
                self.samples.append(self.probe())
        finally:
            connection.close()

    def stop(self) -> list[int]:
        self.stopping.set()
        self.join()
        return self.samples


def spawn(argv: list[str], env: dict, log_dir: str, name: str) -> subprocess.Popen:
    log = open(os.path.join(log_dir, f"{name}.log"), "w")  # noqa: SIM115 (closed in stop())
    proc = subprocess.Popen([sys.executable, "manage.py", *argv], env=env, cwd=ROOT, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    proc.log = log
    return proc


def stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.log.close()


def wait_for(predicate, what: str, procs: list[subprocess.Popen], timeout: float = 1800.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        dead = [p for p in procs if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            log = Path(dead[0].log.name).read_text()[-3000:] if dead else ""
            raise RuntimeError(f"queues bench: {'a worker exited' if dead else 'timed out'} waiting for {what}\n{log}")
        time.sleep(0.05)


def loom_workers(ctx, count: int, threads: int, tag: str) -> list[subprocess.Popen]:
    env = child_env(LOOM_FLOW_MODULES="benchmarks.sections.queues", LOOM_QUEUE_THREADS=str(threads),
                    LOOM_QUEUE_POLL=str(ctx.options["queue_poll"]), ALLOW_DEV_SECRET_KEY="true")
    return [spawn(["loom_worker", "--no-cluster", "--id", f"{tag}-{n}"], env, ctx.log_dir, f"{tag}-{n}")
            for n in range(count)]


def window(prefix: str) -> float:
    """Seconds from the first execution's start to the last one's end (the journal's headers)."""
    rows = Execution.objects.filter(pk__startswith=prefix)
    first = rows.order_by("created_at").values_list("created_at", flat=True).first()
    last = rows.order_by("-finished_at").values_list("finished_at", flat=True).first()
    return max((last - first).total_seconds(), 1e-6)


def run_queue(ctx, name: str, prefix: str, total: int, keys: int | None, cap: int, **caps) -> tuple[float, list]:
    """Queue `total` executions (over `keys` partitions), run them with fresh workers; (seconds, samples)."""
    declare_queue(name, concurrency=cap, **caps)
    bar = ctx.progress(total, f"{name}: enqueue")
    for n in range(total):
        enqueue("bench.queue.one", {}, queue=name, execution_id=f"{prefix}{n:06}",
                partition_key=None if keys is None else f"p{n % keys}")
        bar.update()
    bar.close()
    store = queue_store()
    if keys is None:
        sampler = Sampler(lambda: journal_store().count_executions(prefix, "running"))
    else:
        sampler = Sampler(lambda: max(store.running_by_partition(name).values(), default=0))
    sampler.start()
    workers = loom_workers(ctx, ctx.options["queue_workers"], cap, name)
    try:
        wait_for(lambda: journal_store().count_executions(prefix, "completed") == total, f"{name} to finish", workers)
    finally:
        samples = sampler.stop()
        stop(workers)
    ctx.verify(f"{name}: completed executions", total, journal_store().count_executions(prefix, "completed"))
    return window(prefix), samples


def cleanup(name: str, prefix: str) -> None:
    queue_store().delete_queue(name)
    journal_store().delete_streams(prefix)
    journal_store().delete_executions(prefix)
    forget(name)


def guarded(ctx, name: str, prefix: str, *args, **caps) -> tuple[float, list]:
    """run_queue, whose rows are deleted if it fails (unless --keep): a later run's workers would
    otherwise find this queue's leftover entries and run them too."""
    try:
        return run_queue(ctx, name, prefix, *args, **caps)
    except BaseException:
        if not ctx.options.get("keep"):
            cleanup(name, prefix)
        raise


def run(ctx) -> None:
    options = ctx.options
    ctx.log_dir = tempfile.mkdtemp(prefix="bench-queues-")  # the workers' output, if one fails
    cap, workers = options["queue_cap"], options["queue_workers"]
    tag = f"bq{ctx.run_id}"
    keep = options.get("keep")

    # -- cap --
    name, prefix, total = f"{tag}-cap", f"{tag}c-", options["queue_execs"]
    seconds, samples = guarded(ctx, name, prefix, total, None, cap)
    highest = max(samples, default=0)
    ctx.verify(f"{name}: executions running at once never above the cap (highest seen {highest})", 0,
               max(0, highest - cap))
    ctx.record("cap", {"execs": total, "cap": cap, "workers": workers, "threads": cap}, throughput=total / seconds,
               unit="execs/s", count=total, max_running=highest, samples=len(samples))
    if not keep:
        cleanup(name, prefix)

    # -- partitions --
    name, prefix, total = f"{tag}-part", f"{tag}p-", options["queue_partition_execs"]
    keys = options["queue_partitions"]
    seconds, samples = guarded(ctx, name, prefix, total, keys, cap, partition_concurrency=1)
    highest = max(samples, default=0)
    ctx.verify(f"{name}: running per partition never above 1 (highest seen {highest})", 0, max(0, highest - 1))
    ctx.record("partitions", {"execs": total, "partitions": keys, "partition_cap": 1, "cap": cap, "workers": workers},
               throughput=total / seconds, unit="execs/s", count=total, max_running_per_partition=highest,
               samples=len(samples))
    if not keep:
        cleanup(name, prefix)

    # -- rate --
    limit, period = options["queue_rate"], options["queue_rate_period"]
    name, prefix, total = f"{tag}-rate", f"{tag}r-", 3 * limit
    guarded(ctx, name, prefix, total, None, cap, rate_limit=limit, rate_period=period)
    starts = sorted(QueueEntry.objects.filter(queue_id=name).values_list("started_at", flat=True))
    span = timedelta(seconds=period)
    most, low = 0, 0
    for high, moment in enumerate(starts):  # the most starts in any window of one period (sliding)
        while moment - starts[low] >= span:
            low += 1
        most = max(most, high - low + 1)
    # Starts per period over the run, the last period counted in full (a sliding-window limit lets a
    # burst of `limit` through at the start of each period).
    achieved = len(starts) * period / ((starts[-1] - starts[0]).total_seconds() + period)
    ctx.verify(f"{name}: starts in any {period} s window never above the limit (most seen {most})", 0,
               max(0, most - limit))
    ctx.record("rate", {"limit": limit, "period_s": period, "execs": total, "cap": cap, "workers": workers},
               throughput=achieved / period, unit="starts/s", count=total, max_in_window=most,
               achieved_per_period=achieved, accuracy=most / limit)
    if not keep:
        cleanup(name, prefix)

    # -- tasks: ours, then django-tasks-db --
    ours = run_tasks(ctx, "loom", tag)
    if not apps.is_installed("django_tasks_db"):
        ctx.log("queues: django-tasks-db is not installed (optional extra): tasks ran on Loom only")
        ctx.recorder.skip(ctx.section + ":django-tasks-db", "django-tasks-db not installed")
        return
    theirs = run_tasks(ctx, "django-tasks-db", tag)
    ours.metrics["vs_django_tasks_db"] = ours.throughput / theirs.throughput if theirs.throughput else None
    ours.save(update_fields=["metrics"])


def run_tasks(ctx, backend: str, tag: str):
    """tasks/s over a backlog, then enqueue->start latency of a trickle, on one backend."""
    options = ctx.options
    workers, poll = options["queue_workers"], options["queue_poll"]
    total, trickle = options["queue_task_execs"], options["queue_latency_tasks"]
    queue = f"{tag}-tasks-{'loom' if backend == 'loom' else 'db'}"
    if backend == "loom":
        declare_queue(queue, concurrency=workers)
        bench_task.get_backend().queues.add(queue)  # this run's queue, beside the backend's QUEUES
        task_of = bench_task.using(queue_name=queue)
    else:
        task_of = bench_task.using(backend="dbpeer", queue_name=queue)
    ids: list[str] = []
    late: list[str] = []
    try:
        ids.extend(task_of.enqueue(n).id for n in range(total))
        if backend == "loom":
            procs = loom_workers(ctx, workers, 1, queue)
        else:
            env = child_env(ALLOW_DEV_SECRET_KEY="true")
            procs = [spawn(["db_worker", "--backend", "dbpeer", "--queue-name", queue, "--interval", str(poll),
                            "--no-startup-delay", "--worker-id", f"{queue}-{n}"], env, ctx.log_dir, f"{queue}-{n}")
                     for n in range(workers)]
        try:
            wait_for(lambda: finished(backend, ids) == total, f"{backend} tasks to finish", procs)
            seconds = task_window(backend, ids)
            for n in range(trickle):  # 10 a second: below either backend's rate, so no backlog builds up
                late.append(task_of.enqueue(n).id)
                time.sleep(0.1)
            wait_for(lambda: finished(backend, late) == trickle, f"{backend} trickle to finish", procs)
        finally:
            stop(procs)
    except BaseException:
        if not options.get("keep"):
            _delete_rows(backend, queue, ids + late)
        raise
    latencies = start_latencies(backend, late)
    ctx.verify(f"{backend}: tasks succeeded", total + trickle,
               finished(backend, ids, ok=True) + finished(backend, late, ok=True))
    result = ctx.record(f"tasks {backend}", {"tasks": total, "trickle": trickle, "workers": workers,
                                             "tasks_per_worker": 1, "poll_s": poll},
                        throughput=total / seconds, unit="tasks/s", count=total, latencies_ms=latencies)
    if not options.get("keep"):
        _delete_rows(backend, queue, ids + late)
    return result


def _peer_model():
    return apps.get_model("django_tasks_database", "DBTaskResult")


def _delete_rows(backend: str, queue: str, ids: list[str]) -> None:
    if backend != "loom":
        _peer_model().objects.filter(queue_name=queue).delete()
        return
    queue_store().delete_queue(queue)
    journal_store().delete_streams(ids=ids)
    journal_store().delete_executions(ids=ids)
    forget(queue)


def finished(backend: str, ids: list[str], ok: bool = False) -> int:
    """Tasks of `ids` that finished (ok=True: that succeeded)."""
    if backend == "loom":
        done = ["completed"] if ok else ["completed", "failed", "cancelled", "stuck"]
        return Execution.objects.filter(pk__in=ids, status__in=done).count()
    states = ["SUCCESSFUL"] if ok else ["SUCCESSFUL", "FAILED"]
    return _peer_model().objects.filter(id__in=ids, status__in=states).count()


def task_window(backend: str, ids: list[str]) -> float:
    if backend == "loom":
        rows = Execution.objects.filter(pk__in=ids)
        first = min(rows.values_list("created_at", flat=True))
        last = max(rows.values_list("finished_at", flat=True))
    else:
        rows = _peer_model().objects.filter(id__in=ids)
        first = min(rows.values_list("started_at", flat=True))
        last = max(rows.values_list("finished_at", flat=True))
    return max((last - first).total_seconds(), 1e-6)


def start_latencies(backend: str, ids: list[str]) -> list[float]:
    """Milliseconds from each task's enqueue to its start, both times as its backend recorded them."""
    if backend == "loom":
        enqueued = dict(QueueEntry.objects.filter(execution_id__in=ids).values_list("execution_id", "enqueued_at"))
        started = dict(Execution.objects.filter(pk__in=ids).values_list("pk", "created_at"))
        return [(started[i] - enqueued[i]).total_seconds() * 1000 for i in ids]
    rows = _peer_model().objects.filter(id__in=ids).values_list("enqueued_at", "started_at")
    return [(s - e).total_seconds() * 1000 for e, s in rows]

