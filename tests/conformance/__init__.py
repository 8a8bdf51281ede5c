"""The backend conformance suite: what every store backend must do, written once per store interface.

Each module here holds one abstract contract per store base class, in the style of eventsourcing's
shared recorder tests: `JournalStoreContract` (journal.store.base.JournalStore), `LeaseStoreContract`
(leases.store.base.LeaseStore), `ProjectionStoreContract` (projections.store.base.ProjectionStore).
A backend proves itself by subclassing each contract once in its own test module
(tests/conformance/test_conformance_<backend>.py), naming its `vendor` and implementing `make_store`.

The contracts are named without pytest's `Test` prefix and live outside `test_*.py` modules, so only
the per-backend subclasses are collected. docs/backends.md lists the classes and, per abstract
method, whether a contract exercises it (tests/conformance/test_conformance_docs.py keeps that list true).
"""

from __future__ import annotations

import pytest
from django.db import connection, connections


class StoreContract:
    """What every contract shares: the backend under test and its store, made fresh for each test.

    Not an ABC on purpose: pytest silently skips abstract classes, so a backend subclass missing a
    method would vanish from the run instead of failing it."""

    #: the `connection.vendor` this backend serves; the subclass's module skips on any other.
    vendor: str = ""
    #: the base-class methods the contract exercises, each with the store call that reaches it
    #: (private abstract hooks are reached through a public method); read by test_conformance_docs.
    covers: dict[str, str] = {}

    def make_store(self, alias: str = "default"):
        """A store of this backend serving `alias` (a new instance: no cache shared with the app)."""
        raise NotImplementedError(f"{type(self).__name__} must say how to make its backend's store")

    @staticmethod
    def app_store_for(alias: str = "default"):
        """The app's own `store_for(alias)`: the store production code gets for that alias (each contract)."""
        raise NotImplementedError("each contract names its app's store_for")

    @pytest.fixture
    def store(self):
        return self.make_store()

    def test_store_serves_the_alias_it_is_given(self, store):
        """The store talks to the connection of its alias, and is the backend of that connection."""
        assert store.alias == "default"
        assert store.connection is connections["default"]
        assert store.vendor == connection.vendor == self.vendor

    def test_the_apps_dispatcher_gives_this_backend_for_its_connection(self):
        """What the suite proves is what production runs: `store_for` picks this class for the alias."""
        assert type(self.app_store_for("default")) is type(self.make_store())


def only_on(vendor: str) -> None:
    """Called at the top of a backend's test module: the module runs only when DATABASE_URL names that
    backend (CI runs the suite once per database, so each leg runs one backend's subclasses)."""
    if connection.vendor != vendor:
        pytest.skip(f"{vendor} conformance: run with a {vendor} DATABASE_URL", allow_module_level=True)
