"""`manage.py loom_drain` (old name `drain`: a deprecated alias until 0.3): run the drains without a worker
(once until idle, or --forever)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from projections.declarations import registry
from projections.service import DrainService, drain


class Command(BaseCommand):
    help = "Deliver pending events to reactions and projections (once, or --forever as a worker would)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--lane", help="Drain only this lane.")
        parser.add_argument("--worker-id", help="Name the leases are taken under (default: host:pid).")
        parser.add_argument("--forever", action="store_true", help="Keep draining (listen/poll) until stopped.")

    def handle(self, *args, lane=None, worker_id=None, forever=False, **options) -> None:
        if lane is not None and lane not in registry.lanes:
            raise CommandError(f"no lane {lane!r}; declared: {', '.join(sorted(registry.lanes))}")
        if not forever:
            result = drain(lane, worker_id=worker_id)
            self.stdout.write(f"handled {result.handled} event(s) on {result.acked} stream(s); "
                              f"{result.failed} failure(s), {result.blocked} blocked, {result.lost} lease(s) lost")
            return
        import signal
        import threading

        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        service = DrainService(lanes=[lane] if lane else None)

        class _Node:  # the worker protocol's one attribute
            pass

        node = _Node()
        node.worker_id = worker_id or ""
        service.start(node if worker_id else None)
        try:
            while not stop.wait(0.5):
                pass
        finally:
            service.stop(10.0)
