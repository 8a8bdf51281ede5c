"""leases/unreachable.py: which database errors say "the server cannot be reached" (a connection spike, a
restart, a pool with every session taken), and `patiently` retrying only those (issue #35). No database."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, IntegrityError, InterfaceError, OperationalError

from leases.unreachable import cannot_reach, patiently


@pytest.mark.parametrize("exc, expected", [
    (OperationalError('connection failed: FATAL:  sorry, too many clients already'), True),
    (OperationalError("FATAL:  remaining connection slots are reserved for superuser connections"), True),
    (OperationalError("server closed the connection unexpectedly"), True),
    (OperationalError("couldn't get a connection after 10.00 sec"), True),
    (InterfaceError("connection already closed"), True),
    (OperationalError("database is locked"), False),  # SQLite contention: the run's own, not the server's reach
    (OperationalError("canceling statement due to lock timeout"), False),
    (IntegrityError("duplicate key value violates unique constraint"), False),
    (ValueError("too many clients"), False),
])
def test_what_counts_as_the_database_out_of_reach(exc, expected):
    assert cannot_reach(exc) is expected


def test_a_cause_out_of_reach_counts_too():
    try:
        try:
            raise OperationalError("could not connect to server: Connection refused")
        except OperationalError as inner:
            raise DatabaseError("wrapped") from inner
    except DatabaseError as outer:
        assert cannot_reach(outer)


def test_patiently_retries_only_while_the_database_is_out_of_reach(settings):
    settings.LOOM_RECOVERY_PATIENCE = 30.0
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise OperationalError("FATAL:  sorry, too many clients already")
        return "ran"

    assert patiently(flaky, "test") == "ran" and len(calls) == 3
    calls.clear()

    def refused():
        calls.append(1)
        raise IntegrityError("duplicate key")

    with pytest.raises(IntegrityError):
        patiently(refused, "test")
    assert len(calls) == 1  # not retried: it would fail the same way


def test_patiently_gives_up_after_its_patience(settings):
    settings.LOOM_RECOVERY_PATIENCE = 0.0

    def down():
        raise OperationalError("connection refused")

    with pytest.raises(OperationalError):
        patiently(down, "test")
