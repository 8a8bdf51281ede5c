"""Heartbeat leases, takeover, recovery, the background worker and cron schedules (docs/leases.md)."""

# The face of leases (tests/test_layout.py): what users and the apps above may import.
FACE_MODULES = ("leases.models", "leases.conf", "leases.worker", "leases.store", "leases.store.base",
                "leases.store.postgres", "leases.store.sqlite",
                # wave 14: the operations page's worker drain and schedule actions (queues/operations*.py)
                "leases.drain", "leases.schedule_ops", "leases.schedules")
