"""The queue store: one implementation per database backend, chosen by the connection's vendor.

Each backend module keeps its SQL at the top, named (upsert, enqueue, ready, dequeue steps, stats,
cancel), with the reason for each lock next to it. `store_for(alias)` is the shared dispatcher
(journal.backends) bound to the queue stores.
"""

from __future__ import annotations

from collections.abc import Callable

from journal import backends
from queues.store.base import Claimed, Existing, NewEntry, QueueStats, QueueStore

backends.register("queues", "postgresql", "queues.store.postgres.PostgresQueueStore")
backends.register("queues", "sqlite", "queues.store.sqlite.SqliteQueueStore")

store_for: Callable[..., QueueStore] = backends.dispatcher("queues")

__all__ = ["Claimed", "Existing", "NewEntry", "QueueStats", "QueueStore", "store_for"]
