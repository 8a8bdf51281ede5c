"""Release 2 of `ver.queued`: version 2 only. Its first step differs (`tax` at position 0), so a version-1
log replayed on it would be NonDeterminism; a run records version 2 in the effects table."""

from __future__ import annotations

from journal.flows import flow
from tests.version_common import record


@flow("ver.queued", version=2)
def queued_v2(ctx, value):
    ctx.step("tax", lambda: round(value["n"] * 0.2, 2))
    by = ctx.step("record_v2", lambda: record(ctx.execution_id, 2))
    return {"version": 2, "by": by}
