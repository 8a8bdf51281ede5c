"""The journal store: one implementation per database backend, chosen by the connection's vendor.

`store_for(alias)` returns the store of a database alias (journal.backends, the dispatcher every
app shares). Each backend module keeps all of its SQL at its top, named, with the reason for each
lock, check and ordering rule next to it.
"""

from __future__ import annotations

from collections.abc import Callable

from journal import backends
from journal.store.base import JournalStore

backends.register("journal", "postgresql", "journal.store.postgres.PostgresStore")
backends.register("journal", "sqlite", "journal.store.sqlite.SqliteStore")

store_for: Callable[..., JournalStore] = backends.dispatcher("journal")

__all__ = ["JournalStore", "store_for"]

# Retention (journal/store/retention.py): an interface of its own, both backends in one module.
backends.register("retention", "postgresql", "journal.store.retention.PostgresRetention")
backends.register("retention", "sqlite", "journal.store.retention.SqliteRetention")
retention_store_for = backends.dispatcher("retention")
