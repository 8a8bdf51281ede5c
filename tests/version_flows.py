"""Flows whose code a test changes under recorded executions (tests/flows/test_flow_versions.py,
tests/flows/test_flow_replay.py): CODE["variant"] says which release this process runs, read at every call
(LOOM_TEST_VARIANT sets it in a child process, `manage.py loom replay` run as a deploy's CI would)."""

from __future__ import annotations

import os

from journal.flows import flow
from journal.flows.context import Halt

CODE = {"variant": os.environ.get("LOOM_TEST_VARIANT", "old"), "stop_once": False}


class Stopped(Exception):
    """The run stops here, leaving its execution running (as when its database went away mid-run)."""


def _maybe_stop() -> str:
    if CODE["stop_once"]:
        CODE["stop_once"] = False
        raise Halt(Stopped("stopped mid-run"))
    return "done"


@flow("ver.patched")
def patched(ctx, value):
    """Release "old": tax 1. Release "patched": new executions take tax-v2 (2), older ones keep tax (1)."""
    if CODE["variant"] == "patched" and ctx.patched("tax-v2"):
        tax = ctx.step("tax-v2", lambda: 2)
    else:
        tax = ctx.step("tax", lambda: 1)
    ctx.step("after", _maybe_stop)
    ctx.sleep(value.get("seconds", 3600))
    late = ctx.step("late-v2", lambda: 20) if CODE["variant"] == "patched" and ctx.patched("late") else 10
    return {"tax": tax, "late": late}


@flow("ver.replayed")
def replayed(ctx, value):
    """"old": reserve, wait, ship. "compatible": the same steps (one function body changed) and a new step
    after the wait, where no waiting execution has a record yet. "incompatible": a step inserted before
    the wait, at a position every waiting execution has recorded."""
    variant = CODE["variant"]
    ctx.step("reserve", lambda: value["n"] * (10 if variant == "compatible" else 1))
    if variant == "incompatible":
        ctx.step("fraud-check", lambda: True)
    ctx.recv("go")
    if variant == "compatible":
        ctx.step("notify", lambda: "sent")
    return ctx.step("ship", lambda: "shipped")
