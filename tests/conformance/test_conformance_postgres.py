"""The PostgreSQL backend passes every store contract (tests/conformance); skipped on other databases."""

from __future__ import annotations

from tests.conformance import only_on
from tests.conformance.journal import JournalStoreContract
from tests.conformance.leases import LeaseStoreContract
from tests.conformance.projections import ProjectionStoreContract
from tests.conformance.queues import QueueStoreContract

only_on("postgresql")


class TestPostgresJournalStore(JournalStoreContract):
    vendor = "postgresql"

    def make_store(self, alias: str = "default"):
        from journal.store.postgres import PostgresStore

        return PostgresStore(alias)


class TestPostgresLeaseStore(LeaseStoreContract):
    vendor = "postgresql"

    def make_store(self, alias: str = "default"):
        from leases.store.postgres import PostgresLeaseStore

        return PostgresLeaseStore(alias)


class TestPostgresProjectionStore(ProjectionStoreContract):
    vendor = "postgresql"

    def make_store(self, alias: str = "default"):
        from projections.store.postgres import PostgresProjectionStore

        return PostgresProjectionStore(alias)


class TestPostgresQueueStore(QueueStoreContract):
    vendor = "postgresql"

    def make_store(self, alias: str = "default"):
        from queues.store.postgres import PostgresQueueStore

        return PostgresQueueStore(alias)
