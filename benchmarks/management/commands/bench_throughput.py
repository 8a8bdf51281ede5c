"""`manage.py bench_throughput`: write throughput and latency of the journal, section by section."""

from benchmarks.command import BenchCommand
from benchmarks.sections import THROUGHPUT_SECTIONS


class Command(BenchCommand):
    help = "Measure the journal's throughput and latency on the configured database; every run is recorded."
    sections = THROUGHPUT_SECTIONS
