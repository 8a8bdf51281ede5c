"""Whether a database error says the server could not be reached (down, restarting, failing over, full) rather
than refusing a statement. The journal turns such a failure of a write into DatabaseUnavailable (retryable, in
doubt); the recovery's backoff (leases/unreachable.py) and the API's 503 (loomapi/views.py) use the same test.
"""

from __future__ import annotations

from django.db import InterfaceError, OperationalError

# What a driver says when the server cannot be reached or took the session away (psycopg's texts; the server's
# FATALs of a full or restarting server). A lock timeout, a deadlock, a constraint: not these, the
# statement's own.
SIGNS = ("too many clients", "remaining connection slots", "connection failed", "could not connect",
         "connection refused", "server closed the connection", "terminating connection", "connection is closed",
         "connection already closed", "the database system is", "no connection to the server", "connection timeout",
         "timeout expired", "connection to server", "consuming input failed", "ssl connection has been closed",
         "could not receive data", "could not send data", "connection reset", "broken pipe",
         "couldn't get a connection")  # Django's own pool (OPTIONS["pool"]) with every session taken


def cannot_reach(exc: BaseException) -> bool:
    """Whether `exc` (or what it was raised from) says the database could not be reached, rather than refusing
    a statement."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, InterfaceError):
            return True
        if isinstance(current, OperationalError):
            text = str(current).lower()
            if any(sign in text for sign in SIGNS):
                return True
        current = current.__cause__ or current.__context__
    return False
