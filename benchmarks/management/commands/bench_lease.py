"""`manage.py bench_lease`: heartbeat lease overhead, OFF vs EAGER vs LAZY interleaved (docs/bench-leases.md)."""

from benchmarks.command import BenchCommand
from benchmarks.sections import LEASE_SECTIONS


class Command(BenchCommand):
    help = "Measure what heartbeat leases cost a durable run (off/eager/lazy, interleaved); every run is recorded."
    sections = LEASE_SECTIONS
