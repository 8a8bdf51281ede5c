"""The connection budget: how many database sessions a `loom_worker` and a `loom_serve_api` worker open, by setting,
so that a deployment can be planned against the server's max_connections (docs/workers.md "Connections").

Every thread that touches the database keeps its own session (Django's connections are per thread). The figures
are upper bounds per database (each shard counts its own), measured with real processes by
tests/leases/test_connection_budget.py (pg_stat_activity by application_name):
- a loom_worker's services, idle: the lease keeper, the recovery sweep, the waker and its LISTEN session, the
  queue dispatcher and its LISTEN session, the cron schedules (6, `WORKER_SERVICES`; the drains of projections
  add theirs when projections are declared);
- while busy, up to one more per thread of its pools: LOOM_QUEUE_THREADS queue runners (they keep their sessions),
  LOOM_WAIT_BATCH woken runs and LOOM_RECOVERY_BATCH recovered runs (each closes its own when its run ends), and
  the LOOM_ASYNC_DB_THREADS pool that makes the journal calls of the queued async runs on its event loop
  (LOOM_QUEUE_ASYNC_RUNS of them hold these few sessions between them, none of their own: queues/loop.py;
  `loop_lane_connections`);
- with its django-q2 cluster (not --no-cluster): LOOM_Q_WORKERS worker processes and the cluster's own (3);
- a loom_serve_api worker: one per request thread (`--threads`), plus its lease keeper, its coalescer and its
  get_event LISTEN session (`API_EXTRA`).
"""

from __future__ import annotations

from django.conf import settings

from journal import conf
from journal.flows.aio import pool_size

WORKER_SERVICES = 6  # measured idle (loom_worker --no-cluster, default settings, no projections)
CLUSTER_OWN = 3  # the django-q2 cluster's sessions besides its workers (monitor, pusher, guard)
API_EXTRA = 3  # a loom_serve_api worker's sessions besides its request threads: lease keeper, coalescer, LISTEN


def worker_connections(cluster: bool = True) -> dict[str, int]:
    """The most sessions one loom_worker opens on one database, by part (the keys name the settings)."""
    parts = {
        "services": WORKER_SERVICES,
        "LOOM_QUEUE_THREADS": conf.get("LOOM_QUEUE_THREADS"),
        "LOOM_WAIT_BATCH": conf.get("LOOM_WAIT_BATCH"),
        "LOOM_RECOVERY_BATCH": conf.get("LOOM_RECOVERY_BATCH"),
    }
    if cluster:
        q_workers = int((getattr(settings, "Q_CLUSTER", None) or {}).get("workers") or 0)
        parts["django-q2 cluster (Q_CLUSTER workers + its own)"] = q_workers + CLUSTER_OWN
    return parts


def loop_lane_connections() -> int:
    """The most sessions a loom_worker's loop lane adds (queues/loop.py: the queued runs of async flows, their
    journal calls in the LOOM_ASYNC_DB_THREADS pool), 0 when it has none (LOOM_QUEUE_ASYNC_RUNS or
    LOOM_QUEUE_THREADS is 0). Apart from worker_connections: those are the sessions of a worker that runs no
    async flow, as measured; the planned deployment counts both."""
    return pool_size() if conf.get("LOOM_QUEUE_THREADS") and conf.get("LOOM_QUEUE_ASYNC_RUNS") else 0


def api_connections(threads: int = 1) -> int:
    """The most sessions one loom_serve_api worker process with `threads` request threads opens on one database."""
    return threads + API_EXTRA


def planned_connections() -> int | None:
    """Sessions the planned deployment opens on one database (LOOM_PLANNED_WORKERS loom_workers,
    LOOM_PLANNED_API_WORKERS loom_serve_api workers of LOOM_PLANNED_API_THREADS threads), or None when nothing
    is planned."""
    workers, api = conf.get("LOOM_PLANNED_WORKERS"), conf.get("LOOM_PLANNED_API_WORKERS")
    if not workers and not api:
        return None
    total = (workers or 0) * (sum(worker_connections().values()) + loop_lane_connections())
    return total + (api or 0) * api_connections(conf.get("LOOM_PLANNED_API_THREADS"))


def async_caller_connections() -> int:
    """The most sessions the awaitable faces (astart, aget_event, ...: journal/flows/aio.py) add to a process that
    calls them from async code: one per thread of their pool. In a worker the same pool serves the queued async
    runs of its loop lane (loop_lane_connections); the async runs its waker and recovery sweep resume make
    their journal calls in the thread that drives them."""

    return pool_size()

