"""`manage.py bench_http`: the HTTP API end to end against loom_serve_api on loopback (docs/bench-http.md)."""

from benchmarks.command import BenchCommand
from benchmarks.sections import HTTP_SECTIONS


class Command(BenchCommand):
    help = ("Measure the HTTP API on a real gunicorn server on loopback: fresh and caller-owned-state calls "
            "at several concurrencies, every response validated; every run is recorded.")
    sections = HTTP_SECTIONS
