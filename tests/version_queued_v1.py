"""Release 1 of `ver.queued` (tests/flows/test_flow_versions_queues.py, tests/flows/test_flow_versions_processes.py): a
queued flow that runs to its end at once and records in the effects table who ran it on which version. A
worker whose LOOM_FLOW_MODULES lists only this module has version 1 of it and nothing else."""

from __future__ import annotations

from journal.flows import flow
from tests.version_common import record


@flow("ver.queued")
def queued_v1(ctx, value):
    by = ctx.step("record", lambda: record(ctx.execution_id, 1))
    return {"version": 1, "by": by}
