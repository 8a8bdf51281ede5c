"""`manage.py loom_serve_api` (old name `serve_api`: a deprecated alias until 0.3): the HTTP API under
gunicorn with N warm worker processes (docs/http-api.md)."""

from __future__ import annotations

import os

from django.core.management.base import BaseCommand, CommandError

from journal import conf
from journal.checks import run_failover_check
from loomapi import worker
from loomapi.auth import TokenConfigError, token_entries
from loomapi.server import ApiServer

WORKER_CLASSES = {"gthread": "loomapi.worker.BufferingWorker", "sync": "sync"}


class Command(BaseCommand):
    help = ("Serve the HTTP API with gunicorn: N preloaded worker processes, database connections opened "
            "before the first request; the workers exit when this process dies, even by SIGKILL.")
    requires_system_checks = "__all__"

    def add_arguments(self, parser) -> None:
        parser.add_argument("--bind", default="127.0.0.1:8001", help="host:port to listen on (default %(default)s).")
        parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                            help="Worker processes (default: CPU count, %(default)s).")
        parser.add_argument("--worker-class", choices=tuple(WORKER_CLASSES), default="gthread",
                            help="gthread (default): loomapi's buffering gthread worker, keep-alive connections, "
                                 "a request reaches a thread only once it was received whole; sync: one request per "
                                 "connection, every request goes to a free worker, NOT safe against slow clients "
                                 "without a buffering proxy in front.")
        parser.add_argument("--read-timeout", type=float, default=worker.READ_TIMEOUT,
                            help="Seconds a client has to send a whole request before a 408 (default %(default)s).")
        parser.add_argument("--threads", type=int, default=1,
                            help="Request threads per worker (default %(default)s; each keeps its own DB connection).")
        parser.add_argument("--timeout", type=int, default=30, help="Seconds before a silent worker is restarted.")
        parser.add_argument("--graceful-timeout", type=int, default=10,
                            help="Seconds a stopping worker gets to finish its requests.")
        parser.add_argument("--conn-max-age", type=int, default=None,
                            help="Seconds a worker keeps a database connection (default: for its whole life).")
        parser.add_argument("--access-log", action="store_true", help="Log every request to stderr.")

    def handle(self, *args, **options) -> None:
        run_failover_check(self, options)  # loom.W050, a database check Django's own start-up skips
        if options["workers"] < 1 or options["threads"] < 1:
            raise CommandError("--workers and --threads must be at least 1")
        if options["read_timeout"] <= 0:
            raise CommandError("--read-timeout must be positive")
        try:
            tokens = token_entries()
        except TokenConfigError as exc:
            raise CommandError(f"LOOM_API_TOKENS: {exc}") from None
        if conf.get("LOOM_API_AUTH") and not tokens:
            raise CommandError("LOOM_API_AUTH is on but LOOM_API_TOKENS is empty: every request would be refused. "
                               "Set LOOM_API_TOKENS in your Django settings (or, for a local benchmark only, "
                               "LOOM_API_AUTH = False); only the repository's demo site reads them from environment "
                               "variables")
        if not conf.get("LOOM_API_AUTH"):
            self.stderr.write(self.style.WARNING(
                "LOOM_API_AUTH is off: the API accepts unauthenticated requests (local benchmarks only)"))
        gunicorn_options = {
            "bind": [options["bind"]],
            "workers": options["workers"],
            "worker_class": WORKER_CLASSES[options["worker_class"]],
            "threads": options["threads"],
            "timeout": options["timeout"],
            "graceful_timeout": options["graceful_timeout"],
            "accesslog": "-" if options["access_log"] else None,
            "proc_name": "loom-serve-api",
        }
        worker.READ_TIMEOUT = options["read_timeout"]  # read by the workers, which fork from this process
        ApiServer(gunicorn_options, options["conn_max_age"]).run()
