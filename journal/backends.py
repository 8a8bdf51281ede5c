"""The one dispatcher from a database alias to an app's store: "the store of this connection".

Each app registers its store classes once, per kind and vendor (`journal`, `leases`, `projections`:
`register("leases", "sqlite", "leases.store.sqlite.SqliteLeaseStore")`), and gets a `store_for`
bound to its kind with `dispatcher(kind)`. A store is made once per (kind, alias), for the alias it
is given (several databases can be served side by side), with the class of that alias's vendor; the
class is imported on first use, so a backend a project never connects to is never imported. A
new backend is its store modules plus one `register` line per app (docs/backends.md).

The cache holds stateless objects (a store is its alias; the connection is looked up per call, per
thread), so losing it changes nothing: it is not state anything depends on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import connections
from django.utils.module_loading import import_string

_classes: dict[str, dict[str, str]] = {}
_stores: dict[tuple[str, str], Any] = {}


def register(kind: str, vendor: str, path: str) -> None:
    """Name the store class (dotted path) of `kind` on connections of `vendor` (Django's vendor name)."""
    _classes.setdefault(kind, {})[vendor] = path
    for key in [key for key in _stores if key[0] == kind]:
        del _stores[key]


def store_for(kind: str, alias: str | None = None) -> Any:
    """The `kind` store of database `alias`; NotImplementedError for a vendor nobody registered.

    No alias: the shard bound by the caller's entry point (journal.shards.bound), else the first shard
    (the default database when LOOM_SHARDS is unset)."""
    if alias is None:
        from journal import shards

        alias = shards.home()
    store = _stores.get((kind, alias))
    if store is None:
        vendor = connections[alias].vendor
        path = _classes.get(kind, {}).get(vendor)
        if path is None:
            known = " and ".join(sorted(_classes.get(kind, {}))) or "no backend"
            raise NotImplementedError(f"{kind} supports {known}, not {vendor} (system check loom.E002)")
        store = _stores[(kind, alias)] = import_string(path)(alias)
    return store


def dispatcher(kind: str) -> Callable[..., Any]:
    """`store_for` bound to one kind: what each app exports as `<app>.store.store_for(alias)`."""

    def bound(alias: str | None = None):
        return store_for(kind, alias)

    bound.__name__ = bound.__qualname__ = "store_for"
    bound.__doc__ = f"The {kind} store of database `alias` (journal.backends.store_for)."
    return bound


__all__ = ["dispatcher", "register", "store_for"]
