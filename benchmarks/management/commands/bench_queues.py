"""`manage.py bench_queues`: queue caps with worker processes, partitions, rate limit, and Django tasks
beside django-tasks-db (docs/queues.md, "Figures")."""

from benchmarks.command import BenchCommand
from benchmarks.sections import QUEUE_SECTIONS


class Command(BenchCommand):
    help = ("Measure queues with real worker processes (cap, partitions, rate limit) and Django tasks beside "
            "django-tasks-db; every run is recorded.")
    sections = QUEUE_SECTIONS
