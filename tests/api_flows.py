"""Flows of the HTTP API's server tests, importable by a serve_api and a loom_worker process (LOOM_FLOW_MODULES)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

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


@contextlib.contextmanager
def queued_starts_run_inline(monkeypatch) -> Iterator[None]:
    """Queued starts (and hand-overs, retries) run in this process right after they are queued, on the
    test's database, without ownership leases (the runs are short): every door queues on the one leased
    queue (issue #24), and `queues.run_due` runs what is due here, as a worker's dispatcher would.

    django-q2's sync mode stays on for old-scheme tasks a test queues itself; django-q2 sends post_spawn
    in sync mode too, and the leases app's receiver would start a lease keeper thread in the test process
    that outlives the test: it is disconnected meanwhile.
    """
    from django_q.signals import post_spawn

    from journal.flows.handover import RESUME_QUEUES
    from journal.flows.ownership import get_ownership, set_ownership
    from journal.flows.runtime import QUEUE_STARTS
    from leases.worker import register_q_child
    from queues import enqueuing
    from queues.service import run_due

    def then_run(queue_it):
        def queued(*args, **kwargs):
            answer = queue_it(*args, **kwargs)
            run_due()
            return answer

        return queued

    monkeypatch.setattr("queues.enqueue", then_run(enqueuing.enqueue))
    doors = (QUEUE_STARTS[:], RESUME_QUEUES[:])
    QUEUE_STARTS[:], RESUME_QUEUES[:] = [then_run(enqueuing.enqueue)], [then_run(enqueuing.enqueue_resume)]
    monkeypatch.setattr("django_q.conf.Conf.SYNC", True)
    disconnected = post_spawn.disconnect(dispatch_uid="leases.register_q_child")
    installed = get_ownership()
    set_ownership(None)
    try:
        yield
    finally:
        QUEUE_STARTS[:], RESUME_QUEUES[:] = doors
        set_ownership(installed)
        if disconnected:
            post_spawn.connect(register_q_child, dispatch_uid="leases.register_q_child")
