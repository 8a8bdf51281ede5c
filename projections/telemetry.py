"""The projections' gauges on the metrics page (journal/telemetry.py): per shard and consumer, the events its
subscriptions know of and have not handled yet (tip - at, for streams the correlator has seen) and its blocked
subscriptions, read from the database at each scrape."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from django.db import DatabaseError

from journal import shards, telemetry
from projections.store import store_for

log = logging.getLogger("loom.telemetry")


def gauges() -> Iterator[tuple[str, str, dict[str, str], float]]:
    for alias in shards.shards():
        try:
            lags = list(store_for(alias).lag_by_consumer())
        except DatabaseError:  # that database's gauges are left out, not the next ones' (loom_scrape_database_ok)
            log.warning("projection gauges on %s failed", alias, exc_info=True)
            yield telemetry.database_failed(alias)
            continue
        for consumer, behind, blocked in lags:
            labels = {"alias": alias, "consumer": consumer}
            yield ("loom_projection_lag_events", "Events the consumer's subscriptions know of and have not handled "
                   "(tip - at)", labels, behind)
            yield "loom_projection_blocked", "Subscriptions of the consumer blocked by a failure", labels, blocked
