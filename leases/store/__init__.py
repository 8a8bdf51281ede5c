"""The lease store: one implementation per database backend, chosen by the connection's vendor.

Each backend module keeps its SQL at the top, named (acquire, renew_many, release, expire,
takeover steps, worker heartbeat), with the reason for each lock and ordering rule next to it.
"""

from __future__ import annotations

from django.db import connections

from leases.store.base import LeaseStore, Takeover

_stores: dict[str, LeaseStore] = {}


def store_for(alias: str = "default") -> LeaseStore:
    store = _stores.get(alias)
    if store is None:
        vendor = connections[alias].vendor
        if vendor == "postgresql":
            from leases.store.postgres import PostgresLeaseStore as cls
        elif vendor == "sqlite":
            from leases.store.sqlite import SqliteLeaseStore as cls
        else:
            raise NotImplementedError(f"leases support PostgreSQL and SQLite, not {vendor}")
        store = _stores[alias] = cls(alias)
    return store


__all__ = ["LeaseStore", "Takeover", "store_for"]
