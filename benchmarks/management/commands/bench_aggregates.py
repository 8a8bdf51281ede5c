"""`manage.py bench_aggregates`: event-sourced aggregates under the Act reference's scenarios; recorded."""

from benchmarks.command import BenchCommand
from benchmarks.sections import AGGREGATE_SECTIONS


class Command(BenchCommand):
    help = ("Measure aggregate commits, cached and cold loads, concurrent and contended commits, and the "
            "realistic workflows (ticket, shared inventory) on the configured database; every run is recorded.")
    sections = AGGREGATE_SECTIONS
