"""The journal store: one implementation per database backend, chosen by the connection's vendor.

`store_for(alias)` returns the store of a database alias. Each backend module keeps all of its SQL
at its top, named, with the reason for each lock, check and ordering rule next to it.
"""

from __future__ import annotations

from functools import cache

from django.db import connections

from journal.store.base import JournalStore


@cache
def _store_class(vendor: str) -> type[JournalStore]:
    if vendor == "postgresql":
        from journal.store.postgres import PostgresStore

        return PostgresStore
    if vendor == "sqlite":
        from journal.store.sqlite import SqliteStore

        return SqliteStore
    raise NotImplementedError(f"the journal supports PostgreSQL and SQLite, not {vendor} (system check loom.E002)")


_stores: dict[str, JournalStore] = {}


def store_for(alias: str = "default") -> JournalStore:
    store = _stores.get(alias)
    if store is None:
        store = _stores[alias] = _store_class(connections[alias].vendor)(alias)
    return store


__all__ = ["JournalStore", "store_for"]
