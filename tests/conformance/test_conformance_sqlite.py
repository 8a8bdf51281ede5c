"""The SQLite backend passes every store contract (tests/conformance); skipped on other databases."""

from __future__ import annotations

from tests.conformance import only_on
from tests.conformance.journal import JournalStoreContract
from tests.conformance.leases import LeaseStoreContract
from tests.conformance.projections import ProjectionStoreContract
from tests.conformance.queues import QueueStoreContract

only_on("sqlite")


class TestSqliteJournalStore(JournalStoreContract):
    vendor = "sqlite"

    def make_store(self, alias: str = "default"):
        from journal.store.sqlite import SqliteStore

        return SqliteStore(alias)


class TestSqliteLeaseStore(LeaseStoreContract):
    vendor = "sqlite"

    def make_store(self, alias: str = "default"):
        from leases.store.sqlite import SqliteLeaseStore

        return SqliteLeaseStore(alias)


class TestSqliteProjectionStore(ProjectionStoreContract):
    vendor = "sqlite"

    def make_store(self, alias: str = "default"):
        from projections.store.sqlite import SqliteProjectionStore

        return SqliteProjectionStore(alias)


class TestSqliteQueueStore(QueueStoreContract):
    vendor = "sqlite"

    def make_store(self, alias: str = "default"):
        from queues.store.sqlite import SqliteQueueStore

        return SqliteQueueStore(alias)
