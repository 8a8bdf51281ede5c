"""Who this process is, in the log (flows' recovery events), the lease table and projections' claims."""

from __future__ import annotations

import os
import socket

from journal import conf


def node_identity() -> str:
    """LOOM_WORKER_ID, or host:pid. The one definition every app uses (leases refine it for the
    django-q2 children of a loom_worker, leases/keeper.py node_identity)."""
    return conf.get("LOOM_WORKER_ID") or f"{socket.gethostname()}:{os.getpid()}"
