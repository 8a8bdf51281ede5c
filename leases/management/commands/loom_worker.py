"""`manage.py loom_worker`: one Loom worker node (see docs/workers.md).

It runs the in-process services every app registered (lease heartbeat, recovery sweep,
projection drains...) and, unless --no-cluster, django-q2's cluster for queued and scheduled
tasks. SIGTERM or SIGINT: a graceful shutdown (LOOM_SHUTDOWN_GRACE; docs/workers.md "Signals"): nothing
new is taken, running steps finish and are recorded, and every lease is handed back (expired at once, so
other workers continue the runs); then the cluster stops. SIGKILL: every process of the cluster
dies with it (leases/lifeline.py); the leases expire after LOOM_LEASE_TTL.
"""

from __future__ import annotations

import logging
import os
import signal
import sys

from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from journal import conf, telemetry
from journal.checks import run_failover_check
from leases.checks import SNIPPET, broker_problem
from leases.keeper import set_main
from leases.lifeline import die_with_parents
from leases.worker import Worker, drain_children, set_cluster_event, share_drain_with_children


def console_unless_configured(loom_log: logging.Logger, root: logging.Logger) -> bool:
    """Give the "loom" logger a console handler when neither it nor the root logger has one: a project
    without LOGGING would print none of the worker's INFO lines (Python's last-resort handler shows warnings
    only; issue #28). True when one was added."""
    if loom_log.handlers or root.handlers:
        return False
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    loom_log.addHandler(handler)
    return True


class Command(BaseCommand):
    help = "Run a Loom worker: lease heartbeat, recovery sweep, drains, and the django-q2 cluster."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--id", dest="worker_id", default=None,
                            help="Worker id (default LOOM_WORKER_ID, else host:pid).")
        parser.add_argument("--no-cluster", action="store_true",
                            help="Do not start django-q2's cluster (services only).")
        parser.add_argument("--stop-timeout", type=float, default=10.0,
                            help="Seconds each service gets to stop on SIGTERM (default 10).")
        parser.add_argument("--shutdown-grace", type=float, default=None,
                            help="Seconds running steps get to finish on SIGTERM (default LOOM_SHUTDOWN_GRACE).")
        parser.add_argument("--metrics-port", type=int, default=None,
                            help="Answer Prometheus scrapes on this port at /metrics (needs LOOM_METRICS; "
                                 "docs/observability.md).")
        parser.add_argument("--metrics-host", default="127.0.0.1",
                            help="Address of --metrics-port (default %(default)s).")
        parser.add_argument("--log-level", default=None, type=str.upper,
                            choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
                            help="Level of the 'loom' loggers (default: as LOGGING says, else INFO).")

    def handle(self, *args, worker_id=None, no_cluster=False, stop_timeout=10.0, log_level=None,
               shutdown_grace=None, metrics_port=None, metrics_host="127.0.0.1", **options) -> None:
        run_failover_check(self, options)  # loom.W050, a database check Django's own start-up skips
        # A worker you can watch: its starts, completions, failures, takeovers and recoveries are
        # logged at INFO under "loom.*" (docs/workers.md "Logs"), unless LOGGING set that logger.
        loom_log = logging.getLogger("loom")
        if log_level is not None:
            loom_log.setLevel(log_level)
        elif loom_log.level == logging.NOTSET:
            loom_log.setLevel(logging.INFO)
        console_unless_configured(loom_log, logging.getLogger())
        cluster = None
        if not no_cluster:
            problem = broker_problem()  # also system check loom.E110, which --skip-checks skips
            if problem is not None:
                raise CommandError(f"{problem}. Add to your settings: {SNIPPET} (or run with --no-cluster).")
        worker = Worker(worker_id)
        if not no_cluster:
            from django_q.cluster import Cluster

            from leases.tasks import ensure_schedule

            ensure_schedule()
            # Before the cluster forks: its processes then know they are this worker's children
            # (their own ids <worker id>/<pid>, role "django-q2 child" on the workers page).
            set_main(worker.worker_id)
            # Every process the cluster forks (sentinel, then its workers, pusher and monitor) dies
            # with its parent: a SIGKILLed worker leaves no cluster behind taking queued starts.
            die_with_parents()
            share_drain_with_children()  # before the fork: a graceful shutdown reaches every child
            # The cluster forks: a database connection open in this process would be shared with
            # the children (one socket, two users: corrupted). Close ours; each side reconnects.
            connections.close_all()
            cluster = Cluster()  # installs its own SIGTERM/SIGINT handlers...
        worker.install_signal_handlers()  # ...which ours replace, before anything starts: a signal
        # arriving during start-up then stops everything, not only the cluster.
        try:
            if cluster is not None:
                # Start the cluster first: it forks its processes before any of our threads exist.
                cluster.start()
            if metrics_port is not None:  # after the fork: the children have no server of their own
                metrics_server(metrics_port, metrics_host)
            if not worker.stopped.is_set():
                worker.start()
                self.stdout.write(f"loom worker {worker.worker_id} running ({len(worker.services)} services"
                                  f"{', django-q2 cluster' if cluster else ''}); SIGTERM stops it", ending="\n")
                self.stdout.flush()
            worker.wait()
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            grace = conf.get("LOOM_SHUTDOWN_GRACE") if shutdown_grace is None else max(0.0, shutdown_grace)
            # A SIGTERM to the whole process group (systemd's KillMode=control-group) has killed the cluster
            # with us: a dead sentinel is not stopped, and one that dies as we stop it is given up on.
            cluster_up = cluster is not None and cluster.sentinel is not None and cluster.sentinel.is_alive()
            if cluster_up and grace > 0:
                drain_children()  # they drain alongside this process
                # the sentinel stops its pusher: nothing new reaches the children
                cluster_up = set_cluster_event(cluster.stop_event)
            worker.stop(stop_timeout, grace)
            if cluster_up and cluster.sentinel.is_alive() and set_cluster_event(cluster.stop_event):
                cluster.stop()
        if worker.retiring is not None:
            # A step ignored being told to stop (leases/watchdog.py): its thread cannot be stopped, so the process
            # is replaced in place (same pid for the supervisor), everything else stopped gracefully above.
            self.stdout.write(f"loom worker {worker.worker_id} retired: {worker.retiring}; replacing the process")
            self.stdout.flush()
            sys.stdout.flush()
            sys.stderr.flush()
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # an ignored signal stays ignored through exec: a
            signal.signal(signal.SIGINT, signal.SIG_DFL)  # SIGTERM during the new start-up must still stop it
            os.execv(sys.executable, sys.orig_argv)
        self.stdout.write(f"loom worker {worker.worker_id} stopped")


def metrics_server(port: int, host: str) -> None:
    """The /metrics page of this worker (journal/telemetry.py); refused unless LOOM_METRICS is on."""

    if not telemetry.METRICS:
        raise CommandError("--metrics-port needs LOOM_METRICS=true (docs/observability.md)")
    telemetry.serve_metrics(port, host)
