"""Heartbeat leases, takeover, recovery, the background worker and cron schedules (docs/leases.md)."""

# The face of leases (tests/test_layout.py): what users and the apps above may import.
FACE_MODULES = ("leases.models", "leases.conf", "leases.worker", "leases.store", "leases.store.base",
                "leases.store.postgres", "leases.store.sqlite")
