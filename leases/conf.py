"""The settings the leases app owns, registered with the journal's registry (journal/conf.py).

Imported by `LeasesConfig.ready()`; read them with `conf.get(name)` from either module.
"""

from __future__ import annotations

from journal.conf import Setting, get, get_safe, register, rule

__all__ = ["get", "get_safe", "lease_grace"]

register(
    "leases",
    Setting("LOOM_LEASE_MODE", str, "lazy", "When a run takes its heartbeat lease: off, eager or lazy.",
            choices=("off", "eager", "lazy")),
    Setting("LOOM_LEASE_TTL", float, 30.0, "Seconds a lease lasts without renewal.", 0.05),
    Setting("LOOM_LEASE_RENEW_EVERY", float, 10.0, "Seconds between renewal ticks of a worker.", 0.01),
    Setting("LOOM_LEASE_LAZY_GRACE", float, None, "Seconds a fresh run goes unleased in lazy mode (unset: TTL/3).",
            0.0, optional=True),
    Setting("LOOM_LEASE_CHUNK", int, 500, "Leases renewed per renew_many statement.", 1),
    Setting("LOOM_RECOVERY_EVERY", float, 5.0, "Seconds between recovery sweeps of a worker.", 0.01),
    Setting("LOOM_RECOVERY_MAX_ATTEMPTS", int, 5, "Recoveries of one execution before it is marked stuck (after a "
            "lapsed lease or an orphan; one handed back at a step boundary by a graceful shutdown is no attempt).",
            1),
    Setting("LOOM_RECOVERY_PATIENCE", float, 300.0,
            "Seconds a woken or recovered run keeps retrying (with backoff) while it cannot reach the database "
            "(a connection spike: not a failed attempt); then it lets go and a later sweep takes it over.", 0.0),
    Setting("LOOM_RECOVERY_BATCH", int, 16, "Executions one sweep takes over at most (resumed in parallel).", 1),
    Setting("LOOM_RECOVERY_FULL_EVERY", float, 600.0,
            "Seconds between a worker's full orphan passes (one also at its start): in between, a sweep looks for "
            "orphans only among the headers that passed the grace since its last sweep (0: every sweep is full).",
            0.0),
    Setting("LOOM_PLANNED_WORKERS", int, None,
            "loom_worker processes the deployment runs per database (the connection budget check loom.W130; "
            "unset: not checked).", 0, optional=True),
    Setting("LOOM_PLANNED_API_WORKERS", int, None,
            "loom_serve_api worker processes the deployment runs (the connection budget check loom.W130).", 0,
            optional=True),
    Setting("LOOM_PLANNED_API_THREADS", int, 1,
            "Request threads of each planned loom_serve_api worker (--threads).", 1),
    Setting("LOOM_WORKER_RETENTION", float, 86400.0,
            "Seconds the workers page keeps a worker that stopped or vanished (pruned by loom_worker).", 0),
    Setting("LOOM_SCHEDULE_EVERY", float, 1.0, "Seconds between a worker's ticks of the cron schedules.", 0.01),
    Setting("LOOM_SCHEDULE_GRACE", float, 60.0,
            "Seconds a tick may be late and still run under catch_up='skip' (after downtime, say).", 0.0),
    Setting("LOOM_SCHEDULE_BATCH", int, 100, "Due schedules one tick claims at most.", 1),
    Setting("LOOM_SCHEDULE_CATCH_UP_MAX", int, 100,
            "Missed ticks one claim starts at most under catch_up='all' (the next claims start the rest).", 1),
    Setting("LOOM_DRAIN_POLL", float, 1.0,
            "Seconds between a worker's reads of its drain request (leases/drain.py: how soon it starts draining).",
            0.01),
)


@rule
def renewal_within_ttl() -> list[str]:
    """A worker renews its leases more often than they expire (loom.E001 otherwise)."""
    if get_safe("LOOM_LEASE_RENEW_EVERY", 0) >= get_safe("LOOM_LEASE_TTL", 1e9):
        return ["LOOM_LEASE_RENEW_EVERY must be shorter than LOOM_LEASE_TTL, or leases expire between renewals"]
    return []


def lease_grace() -> float:
    """Lazy-mode grace: LOOM_LEASE_LAZY_GRACE, or a third of the TTL when unset."""
    grace = get("LOOM_LEASE_LAZY_GRACE")
    return get("LOOM_LEASE_TTL") / 3 if grace is None else grace
