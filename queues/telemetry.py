"""The queues' gauges on the metrics page (journal/telemetry.py): depth, due entries, running and the age of
the oldest due pending entry, per queue and database alias, read from the database at each scrape (so every
worker host reports the same figures, not its own memory)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime

from django.db import DatabaseError

from journal import shards, telemetry
from leases.store.sqlite import stamp
from queues.models import Queue
from queues.store import store_for

log = logging.getLogger("loom.telemetry")


def _aliases() -> list[str]:
    from django.db import router

    return shards.shards() if shards.sharded() else [router.db_for_read(Queue) or "default"]


def gauges() -> Iterator[tuple[str, str, dict[str, str], float]]:
    from django.db import connections

    for alias in _aliases():
        store = store_for(alias)
        now = datetime.now(UTC)
        sqlite = connections[alias].vendor == "sqlite"
        try:  # both read before anything is yielded: a database that fails gives none of its gauges
            oldest = store.oldest_due(stamp(now) if sqlite else now)
            stats = store.queue_stats()
        except DatabaseError:  # that database's gauges are left out, not the next ones' (loom_scrape_database_ok)
            log.warning("queue gauges on %s failed", alias, exc_info=True)
            yield telemetry.database_failed(alias)
            continue
        for one in stats:
            labels = {"alias": alias, "queue": one.name}
            yield "loom_queue_depth", "Pending entries of the queue (due or not)", labels, one.pending
            yield "loom_queue_ready", "Pending entries of the queue already due", labels, one.ready
            yield "loom_queue_running", "Entries of the queue claimed and running", labels, one.running
            due = oldest.get(one.name)
            if isinstance(due, str):
                due = datetime.fromisoformat(due).replace(tzinfo=UTC)
            age = 0.0 if due is None else max(0.0, (now - due).total_seconds())
            yield ("loom_queue_oldest_pending_age_seconds", "Seconds the oldest due pending entry has waited "
                   "(0: none)", labels, age)
