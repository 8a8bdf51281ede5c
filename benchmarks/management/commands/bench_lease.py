"""`manage.py bench_lease`: heartbeat lease overhead, OFF vs EAGER vs LAZY interleaved (docs/bench-leases.md)."""

from benchmarks.command import BenchCommand


class Command(BenchCommand):
    help = "Measure what heartbeat leases cost a durable run (off/eager/lazy, interleaved); every run is recorded."
    sections = {"lease": "benchmarks.sections.lease"}
