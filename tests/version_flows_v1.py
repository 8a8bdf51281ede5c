"""Release 1 of `ver.order` (tests/flows/test_flow_versions*.py): a worker whose LOOM_FLOW_MODULES lists only this
module has version 1 and nothing else. It waits on a timer or a message, then records who ran its last step."""

from __future__ import annotations

from journal.flows import flow
from tests.version_common import worker_id


@flow("ver.order")
def order_v1(ctx, value):
    ctx.step("reserve", lambda: value["n"])
    if value.get("wait") == "timer":
        ctx.sleep(value.get("seconds", 3600))
    else:
        ctx.recv("go")
    by = ctx.step("charge", worker_id)
    return {"version": 1, "by": by}
