"""LISTEN sessions: a psycopg connection of its own (autocommit) per listener thread.

Every listener of the runtime connects here: projections' drain listener, the waker of parked executions,
the queue dispatcher's and the one `get_event` listener of a process (journal/flows/event_listener.py).
A session is opened with the alias's own connection parameters (Django's `get_connection_params()`: its
OPTIONS such as `sslmode`, `sslrootcert`, `service`, `connect_timeout`; an empty HOST is libpq's Unix
socket, as for Django's own connection), not a host/port/name rebuilt by hand, so a listener reaches the
server the way the application does. Behind a transaction-pooling PgBouncer LISTEN needs the server
itself: host and port come from the alias's `LOOM_DIRECT` entry (docs/scaling.md); a pooled alias without
one cannot listen (its callers poll).
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import connections

log = logging.getLogger("loom.listen")

CONNECT_TIMEOUT_S = 10
"""libpq's connect_timeout when the alias's OPTIONS set none: a server that drops packets instead of refusing
them must not hold a listener (or a worker's start) for the kernel's two minutes."""


KEEPALIVES = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3}
"""TCP keepalives unless the alias's OPTIONS set them: a listener only reads, so a session the network dropped
silently (a NAT or a failover that sends no reset) would otherwise wait for notifications forever while its
callers sleep their longer listening poll; with these, the kernel ends it in about a minute and the listener
reconnects."""


def direct_address(alias: str) -> dict | None:
    """Where LISTEN may connect for `alias`: the alias itself, or — for an alias behind a transaction-pooling
    PgBouncer (DISABLE_SERVER_SIDE_CURSORS) — its `LOOM_DIRECT` entry ({"HOST": ..., "PORT": ...}: the
    PostgreSQL server behind the pooler); None when a pooled alias has none. LISTEN is session state: the
    pooler gives the session's server connection to other clients after each transaction, so the
    notifications would go to whichever client holds it, or nowhere (docs/scaling.md)."""
    s = connections[alias].settings_dict
    direct = s.get("LOOM_DIRECT")
    if direct:
        return {"HOST": direct.get("HOST", s.get("HOST")), "PORT": direct.get("PORT", s.get("PORT"))}
    if s.get("DISABLE_SERVER_SIDE_CURSORS"):
        return None
    return {"HOST": s.get("HOST"), "PORT": s.get("PORT")}


def polls_without_direct(alias: str, who: str, poll: str) -> bool:
    """Whether `who` must poll (every `poll`, a setting's name) instead of listening on `alias`: behind a
    transaction pooler without a LOOM_DIRECT address. Said here, once per caller: the caller starts no
    listener, since retrying a configuration that cannot change while the process runs would only spin."""
    if direct_address(alias) is not None:
        return False
    log.warning("%s: %s is behind a transaction pooler and has no LOOM_DIRECT address: no LISTEN, polling every "
                "%s (docs/scaling.md)", who, alias, poll)
    return True


def session_params(alias: str) -> dict[str, Any] | None:
    """psycopg.connect's keyword arguments of a LISTEN session on `alias`, or None (pooled, no LOOM_DIRECT)."""
    address = direct_address(alias)
    if address is None:
        return None
    params = connections[alias].get_connection_params()
    for key, value in (("host", address.get("HOST")), ("port", address.get("PORT"))):
        if value:
            params[key] = value
        else:
            params.pop(key, None)  # libpq's default (a Unix socket, port 5432), as Django's own connection
    params.setdefault("connect_timeout", CONNECT_TIMEOUT_S)
    for key, value in KEEPALIVES.items():
        params.setdefault(key, value)
    params["autocommit"] = True
    return params


def connect(alias: str):
    """A new session on `alias` for LISTEN (raises what psycopg raises; ValueError for a pooled alias without
    a LOOM_DIRECT address)."""
    import psycopg

    params = session_params(alias)
    if params is None:
        raise ValueError(f"{alias} is behind a transaction pooler and has no LOOM_DIRECT address")
    return psycopg.connect(**params)


def listen(alias: str, channel: str):
    """A session LISTENing on `channel` of `alias`, or None if it cannot (logged: the caller polls)."""
    from psycopg import sql

    if session_params(alias) is None:
        return None  # pooled, no direct address: the notifications would go to another client
    try:
        conn = connect(alias)
    except Exception as exc:
        log.warning("cannot LISTEN on %s of %s (%s); polling", channel, alias, exc)
        return None
    try:
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
    except Exception as exc:  # connected but refused: the session is closed, not left to the server
        conn.close()
        log.warning("cannot LISTEN on %s of %s (%s); polling", channel, alias, exc)
        return None
    return conn
