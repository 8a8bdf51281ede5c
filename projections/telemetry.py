"""The projections' gauges on the metrics page (journal/telemetry.py): per shard and consumer, the events its
subscriptions know of and have not handled yet (tip - at, for streams the correlator has seen) and its blocked
subscriptions, read from the database at each scrape."""

from __future__ import annotations

from collections.abc import Iterator


def gauges() -> Iterator[tuple[str, str, dict[str, str], float]]:
    from journal import shards
    from projections.store import store_for

    for alias in shards.shards():
        for consumer, behind, blocked in store_for(alias).lag_by_consumer():
            labels = {"alias": alias, "consumer": consumer}
            yield ("loom_projection_lag_events", "Events the consumer's subscriptions know of and have not handled "
                   "(tip - at)", labels, behind)
            yield "loom_projection_blocked", "Subscriptions of the consumer blocked by a failure", labels, blocked
