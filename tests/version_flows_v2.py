"""Release 2 of `ver.order`: version 2 only (a worker listing only this module cannot run version 1). Its
steps differ before the wait (a `tax` step at position 1), so replaying a version-1 log on it is
NonDeterminism: an execution that completes here was routed right."""

from __future__ import annotations

from journal.flows import flow
from tests.version_common import worker_id


@flow("ver.order", version=2)
def order_v2(ctx, value):
    ctx.step("reserve", lambda: value["n"])
    ctx.step("tax", lambda: round(value["n"] * 0.2, 2))
    if value.get("wait") == "timer":
        ctx.sleep(value.get("seconds", 3600))
    else:
        ctx.recv("go")
    by = ctx.step("charge_with_tax", worker_id)
    return {"version": 2, "by": by}
