"""The lease store: one implementation per database backend, chosen by the connection's vendor.

Each backend module keeps its SQL at the top, named (acquire, renew_many, release, expire,
takeover steps, worker heartbeat), with the reason for each lock and ordering rule next to it.
`store_for(alias)` is the shared dispatcher (journal.backends) bound to the leases stores.
"""

from __future__ import annotations

from collections.abc import Callable

from journal import backends
from leases.store.base import LeaseStore, Reservation, Takeover

backends.register("leases", "postgresql", "leases.store.postgres.PostgresLeaseStore")
backends.register("leases", "sqlite", "leases.store.sqlite.SqliteLeaseStore")

store_for: Callable[..., LeaseStore] = backends.dispatcher("leases")

__all__ = ["LeaseStore", "Reservation", "Takeover", "store_for"]
