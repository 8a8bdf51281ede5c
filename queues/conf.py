"""The settings the queues app owns, registered with the journal's registry (journal/conf.py).

Imported by `QueuesConfig.ready()`; read them with `conf.get(name)`.
"""

from __future__ import annotations

import json
from typing import Any

from journal.conf import Setting, _channel_problem, get, get_safe, register
from leases.conf import lease_grace
from queues.declarations import QueueSpec
from queues.exceptions import InvalidQueue

__all__ = ["claim_timeout", "get", "get_safe"]


def queue_table(value: Any) -> dict:
    """LOOM_QUEUES as a dict of queue name -> options; JSON text is accepted (environment variables)."""
    if isinstance(value, str):
        value = json.loads(value)
    if not isinstance(value, dict):
        raise TypeError("LOOM_QUEUES is a dict of queue name -> options")
    return dict(value)


queue_table.__name__ = "dict of queue declarations"


def _queues_problem(value: dict) -> str | None:
    for name, options in value.items():
        try:
            QueueSpec.from_options(name, options)
        except InvalidQueue as exc:
            return f"declares an unusable queue: {exc}"
    return None


def _queue_channel_problem(value: str) -> str | None:
    """LOOM_QUEUE_CHANNEL: a PostgreSQL channel name, or empty (no notifications: workers poll)."""
    return None if value == "" else _channel_problem(value)


register(
    "queues",
    Setting("LOOM_QUEUES", queue_table, {},
            'Queues and their caps: {"emails": {"concurrency": 8, "partition_concurrency": 1, "rate_limit": 100, '
            '"rate_period": 60}} (docs/queues.md).', check=_queues_problem),
    Setting("LOOM_QUEUE_THREADS", int, 8, "Queued executions one loom_worker process runs at once.", 0),
    Setting("LOOM_QUEUE_ASYNC_RUNS", int, 100,
            "Queued executions of `async def` flows one loom_worker process runs at once on its event loop, besides "
            "LOOM_QUEUE_THREADS (their journal calls in the LOOM_ASYNC_DB_THREADS pool, their short sleeps holding "
            "no thread). 0: they run on the LOOM_QUEUE_THREADS threads like sync flows.", 0),
    Setting("LOOM_QUEUE_POLL", float, 0.1, "Seconds a worker's queue dispatcher sleeps when it found nothing to start.",
            0.001),
    Setting("LOOM_QUEUE_CHANNEL", str, "loom_queues",
            "PostgreSQL channel on which an entry made pending (enqueued, offered again) is notified; a worker's "
            "dispatcher LISTENs on it. Empty: no notifications, workers poll every LOOM_QUEUE_POLL.",
            check=_queue_channel_problem),
    Setting("LOOM_QUEUE_IDLE_POLL", float, 5.0,
            "Seconds a dispatcher that LISTENs on LOOM_QUEUE_CHANNEL sleeps when no queue has due work (sooner "
            "if a deferred entry falls due; a notification wakes it at once). Not listening: LOOM_QUEUE_POLL.",
            0.001),
    Setting("LOOM_QUEUE_CLAIM_TIMEOUT", float, None,
            "Seconds a claimed entry may go without its execution beginning before it is offered again "
            "(unset: LOOM_LEASE_TTL + the lazy grace).", 0.01, optional=True),
    Setting("LOOM_QUEUE_RETENTION", float, 86400.0,
            "Seconds a finished queue entry is kept (loom_worker prunes older ones; never inside a rate window).", 0),
    Setting("LOOM_QUEUE_DEFAULT_CONCURRENCY", int, 10,
            "Cap of the `default` queue (always declared, unless LOOM_QUEUES or code declares it: API starts, "
            "hand-overs, cron ticks and starts without a queue run there) and of a queue a Tasks backend names "
            "without declaring it in LOOM_QUEUES.", 1),
)


def claim_timeout() -> float:
    """LOOM_QUEUE_CLAIM_TIMEOUT, or the recovery sweep's orphan window (a begun run has its lease by then)."""
    value = get("LOOM_QUEUE_CLAIM_TIMEOUT")
    if value is not None:
        return value
    return get("LOOM_LEASE_TTL") + lease_grace()
