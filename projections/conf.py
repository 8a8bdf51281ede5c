"""The settings the projections app owns, registered with the journal's registry (journal/conf.py).

Imported by `ProjectionsConfig.ready()`; read them with `conf.get(name)` from either module.
"""

from __future__ import annotations

from journal.conf import Setting, get, get_safe, register

__all__ = ["get", "get_safe"]

register(
    "projections",
    Setting("LOOM_DRAIN_LEASE_SECONDS", float, 10.0, "How long a drain holds the streams it claimed.", 0.01),
    Setting("LOOM_DRAIN_BATCH", int, 100, "Events fetched per claimed stream per drain cycle.", 1),
    Setting("LOOM_DRAIN_STREAMS", int, 10, "Streams one drain cycle claims at most.", 1),
    Setting("LOOM_DRAIN_RETRIES", int, 3, "Failures of a handler on one stream before it is blocked.", 1),
    Setting("LOOM_DRAIN_POLL_MS", int, 500, "Polling interval of a drain when no notification arrives.", 1),
    Setting("LOOM_DRAIN_LISTEN", bool, True,
            "On PostgreSQL, wake drains with LISTEN (turn off behind poolers that lack it)."),
    Setting("LOOM_DRAIN_RETRY_DELAY", float, 0.5, "Seconds a failed stream waits before its next attempt.", 0.0),
    Setting("LOOM_CORRELATE_HORIZON_SECONDS", float, 2.0,
            "Seconds after which a missing event id counts as rolled back (correlation checkpoint).", 0.0),
    Setting("LOOM_CORRELATE_BATCH", int, 5000, "Events one correlation scan reads per page.", 1),
    Setting("LOOM_PROJECTION_MODULES", list, [], "Modules imported at start-up that declare reactions/projections."),
)
