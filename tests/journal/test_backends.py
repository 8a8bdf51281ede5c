"""The one dispatcher shared by every app (journal/backends.py) and the capabilities that replaced
vendor checks above the stores (issue 14)."""

from __future__ import annotations

import pytest
from django.db import connection

import journal.store
import leases.store
import projections.store
from journal import backends
from journal.flows.runtime import process_identity
from journal.identity import node_identity
from leases.keeper import LeaseKeeper
from leases.keeper import node_identity as lease_node_identity
from leases.ownership import LeaseOwnership
from projections.service import default_worker_id


def test_every_app_gets_its_store_from_the_one_dispatcher():
    """`<app>.store.store_for(alias)` is journal.backends.store_for bound to the app's kind: one store
    per (kind, alias), made for the alias it is given, of that alias's vendor."""
    for kind, module in (("journal", journal.store), ("leases", leases.store), ("projections", projections.store)):
        store = module.store_for("default")
        assert store is backends.store_for(kind, "default") is module.store_for()
        assert store.alias == "default"
        assert store.vendor == connection.vendor


def test_a_vendor_nobody_registered_is_refused_naming_the_kind():
    backends.register("test-kind", "no-such-vendor", "journal.store.sqlite.SqliteStore")
    with pytest.raises(NotImplementedError, match="test-kind supports no-such-vendor, not "):
        backends.store_for("test-kind", "default")


def test_one_node_identity_for_flows_leases_and_projections(settings):
    settings.LOOM_WORKER_ID = "node-7"
    assert node_identity() == process_identity() == lease_node_identity() == default_worker_id() == "node-7"
    settings.LOOM_WORKER_ID = ""
    assert process_identity() == default_worker_id() == lease_node_identity() == node_identity()


def test_inline_leases_follow_the_lease_stores_capability_not_a_vendor_check():
    """Eager runs write their lease inside the bootstrap statement only where the lease store has a
    companion (PostgreSQL); on SQLite the keeper path stays."""
    keeper = LeaseKeeper("cap-node", autostart=False)
    ownership = LeaseOwnership("eager", keeper)
    assert ownership.companion is leases.store.store_for().companion
    assert (ownership.companion is not None) == (connection.vendor == "postgresql")
    assert (ownership.inline_lease() is not None) == (connection.vendor == "postgresql")
    assert LeaseOwnership("lazy", keeper).inline_lease() is None
    assert projections.store.store_for().notifications == (connection.vendor == "postgresql")
