"""`atomic(alias)`: Django's `transaction.atomic`, all or nothing inside a caller's manual transaction on
SQLite too.

With autocommit off (`transaction.set_autocommit(False)`) and nothing written yet, Django's atomic() opens
its block with a SAVEPOINT. Python's sqlite3 begins a transaction implicitly only before a data-changing
statement, so that SAVEPOINT is SQLite's outermost one, and its RELEASE commits: a journal write there was
committed before the caller's own rollback. Every atomic block of the runtime goes through here, which
begins the caller's transaction first (IMMEDIATE, as loomsite's `transaction_mode` does: writers queue for
the lock instead of failing to upgrade); the caller's commit or rollback then decides, as on PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connections, transaction


@contextmanager
def atomic(alias: str) -> Iterator[None]:
    """Django's atomic block on `alias`, which on SQLite under a manual transaction first BEGINs it."""
    connection = connections[alias]
    if connection.vendor == "sqlite" and not connection.get_autocommit() and not connection.in_atomic_block:
        connection.ensure_connection()
        if not connection.connection.in_transaction:
            connection.connection.execute("BEGIN IMMEDIATE")
    with transaction.atomic(using=alias):
        yield
