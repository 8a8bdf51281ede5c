"""Flows of the telemetry tests, in a module worker processes import (LOOM_FLOW_MODULES=tests.telemetry_flows)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from journal.flows import RetryPolicy, flow

RETRY = RetryPolicy(attempts=3, backoff=0.05)


@flow("telemetry.flaky")
def flaky(ctx, value):
    """A step that fails its first attempt (retried), then one that blocks while `hold` exists, so that a test
    can SIGKILL the worker inside it (its recovery on another worker finds the file gone)."""
    ctx.step("flaky", _flaky, value["dir"], retry=RETRY)
    ctx.step("hold", _hold, value["dir"])
    return {"done": True}


def _flaky(directory: str) -> str:
    marker = Path(directory, "flaky-failed")
    if not marker.exists():
        marker.write_text(str(os.getpid()))
        raise RuntimeError("the first attempt fails")
    return "ok"


def _hold(directory: str) -> int:
    Path(directory, f"in-hold-{os.getpid()}").write_text("")
    while Path(directory, "hold").exists():
        time.sleep(0.05)
    return os.getpid()


@flow("telemetry.double")
def double(ctx, value):
    return ctx.step("double", lambda: value["n"] * 2)


@flow("telemetry.sleeps")
def sleeps(ctx, value):
    """A short sleep (in the thread) then a long one (the run parks: a waker runs the rest later)."""
    ctx.sleep(0.01)
    ctx.sleep(3600)
    return "woken"
