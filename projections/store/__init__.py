"""The SQL of reactions and projections: one module per backend, chosen by the connection's vendor."""

from __future__ import annotations

from django.db import connections

from projections.store.base import Claim, ProjectionStore, ScannedEvent


def store_for(alias: str = "default") -> ProjectionStore:
    vendor = connections[alias].vendor
    if vendor == "postgresql":
        from projections.store.postgres import PostgresProjectionStore

        return PostgresProjectionStore(alias)
    if vendor == "sqlite":
        from projections.store.sqlite import SqliteProjectionStore

        return SqliteProjectionStore(alias)
    raise NotImplementedError(f"projections support PostgreSQL and SQLite, not {vendor}")


__all__ = ["Claim", "ProjectionStore", "ScannedEvent", "store_for"]
