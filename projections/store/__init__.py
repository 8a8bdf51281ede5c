"""The SQL of reactions and projections: one module per backend, chosen by the connection's vendor.

`store_for(alias)` is the shared dispatcher (journal.backends) bound to the projections stores.
"""

from __future__ import annotations

from collections.abc import Callable

from journal import backends
from projections.store.base import Claim, ProjectionStore, ScannedEvent

backends.register("projections", "postgresql", "projections.store.postgres.PostgresProjectionStore")
backends.register("projections", "sqlite", "projections.store.sqlite.SqliteProjectionStore")

store_for: Callable[..., ProjectionStore] = backends.dispatcher("projections")

__all__ = ["Claim", "ProjectionStore", "ScannedEvent", "store_for"]
