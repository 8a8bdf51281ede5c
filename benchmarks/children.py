"""Child processes of a bench (producers, subscribers, the HTTP server) use the database this run writes to.

The run writes through `connection` (the alias it was given); the environment's DATABASE_URL may name
another database (a test runner's test database, a second alias), so a child gets a URL built from the
connection's own settings, never the inherited variable.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from urllib.parse import quote

from django.db import connection as default_connection

ROOT = Path(__file__).resolve().parent.parent


def database_url(conn=None) -> str:
    """The URL of the database `conn` (default: `connection`) is connected to, for a child's DATABASE_URL."""
    conn = conn or default_connection
    s = conn.settings_dict
    if conn.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    if conn.vendor != "postgresql":
        raise ValueError(f"bench children run on SQLite or PostgreSQL, not {conn.vendor}")
    user = quote(s.get("USER") or "postgres", safe="")
    password = f":{quote(s['PASSWORD'], safe='')}" if s.get("PASSWORD") else ""
    hosts = str(s.get("HOST") or "127.0.0.1").split(",")
    ports = str(s.get("PORT") or 5432).split(",")
    ports += ports[-1:] * (len(hosts) - len(ports))  # libpq: one port for every host, or one for all
    host = ",".join(f"{h}:{p}" for h, p in zip(hosts, ports, strict=False))
    # A multi-host DSN (a primary and its standby, docs/scaling.md "High availability") keeps its target.
    target = (s.get("OPTIONS") or {}).get("target_session_attrs")
    return f"postgres://{user}{password}@{host}/{s['NAME']}" + (f"?target_session_attrs={target}" if target else "")


def child_env(conn=None, **extra: str) -> dict[str, str]:
    """This process's environment, with the run's database and the project on PYTHONPATH.

    The child inherits DJANGO_SETTINGS_MODULE: the same settings as this process, whatever project hosts
    the apps (settings.SETTINGS_MODULE is None under override_settings, so it is not used)."""
    # The project's folder (sys.path[0]: where manage.py runs, the host's settings) and this package's.
    path = os.pathsep.join(dict.fromkeys(p for p in [sys.path[0], str(ROOT), os.environ.get("PYTHONPATH", "")] if p))
    return {**os.environ, "PYTHONPATH": path, "DATABASE_URL": database_url(conn), **extra}
