"""What both releases of tests/version_flows_v*.py share, in a module that registers no flow (a worker listing
only version_flows_v2 must not get version 1 through an import)."""

from __future__ import annotations

import os


def worker_id() -> str:
    return os.environ.get("LOOM_WORKER_ID", f"pid-{os.getpid()}")
