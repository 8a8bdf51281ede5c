"""Flows of the HTTP API's server tests, importable by a serve_api and a loom_worker process (LOOM_FLOW_MODULES)."""

from __future__ import annotations

import os
import time

from journal.flows import Context, flow


@flow("tests.api.gated")
def gated(ctx: Context, value: dict) -> str:
    """Runs until the file named by value["gate"] exists (at most 120 s): as long as the test wants."""

    def wait() -> str:
        deadline = time.monotonic() + 120
        while not os.path.exists(value["gate"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        return "opened"

    return ctx.step("wait", wait)


@flow("tests.api.hangs")
def hangs(ctx: Context, seconds: float) -> str:
    """A transient call that hangs (for the per-call timeout)."""
    time.sleep(seconds)
    return "woke"
