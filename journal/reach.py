"""Whether a database error says the server could not be reached (down, restarting, failing over, full) rather
than refusing a statement. The journal turns such a failure of a write into DatabaseUnavailable (retryable, in
doubt); the recovery's backoff (leases/unreachable.py) and the API's 503 (loomapi/views.py) use the same test.
"""

from __future__ import annotations

import errno

from django.db import InterfaceError, OperationalError

# What a driver says when the server cannot be reached or took the session away (psycopg's texts; the server's
# FATALs of a full or restarting server). A lock timeout, a deadlock, a constraint: not these, the
# statement's own.
SIGNS = ("too many clients", "remaining connection slots", "connection failed", "could not connect",
         "connection refused", "server closed the connection", "terminating connection", "connection is closed",
         "connection already closed", "the database system is", "no connection to the server", "connection timeout",
         "timeout expired", "connection to server", "consuming input failed", "ssl connection has been closed",
         "could not receive data", "could not send data", "connection reset", "broken pipe",
         "couldn't get a connection",  # Django's own pool (OPTIONS["pool"]) with every session taken
         # psycopg 3's own texts for a session the server dropped (psycopg/pq/pq_ctypes.py, waiting.py,
         # generators.py): libpq closed the socket after the server went ("the connection is lost"); poll/select
         # saw the socket hang up ("connection socket closed": but see OWN_FD); a connection attempt whose
         # session went bad before it was up ("connection is bad: ...").
         "the connection is lost", "connection socket closed", "connection is bad")
# Left out, the statement's or our process's own, not the server's: "connection socket closed" raised from
# EBADF (psycopg's fstat/select on a descriptor this process closed: a bug here, retrying will not mend it);
# "cannot execute operations: the connection is in status ..." (an InterfaceError on a connection used in the
# wrong state, e.g. mid-COPY); "failed to resolve host" and "no host found after SRV RR lookup" (a name
# that does not resolve: configuration or DNS, not a server gone); "connection not in pipeline mode", "failed to
# enter pipeline mode" (how we drive the connection).
OWN_FD = "connection socket closed"


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
            if OWN_FD in text and _bad_fd(current.__cause__):
                return False  # a descriptor this process closed: a bug here, not a server gone
            if any(sign in text for sign in SIGNS):
                return True
        current = current.__cause__ or current.__context__
    return False


def _bad_fd(cause: BaseException | None) -> bool:
    """Whether psycopg's "connection socket closed" came from EBADF (the fd was closed in this process), looking
    through Django's wrapper (whose cause is psycopg's error, whose cause is the OSError)."""
    while cause is not None:
        if isinstance(cause, OSError):
            return cause.errno == errno.EBADF
        cause = cause.__cause__
    return False
