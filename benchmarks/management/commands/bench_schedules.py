"""`manage.py bench_schedules`: tick lateness of many cron schedules (docs/schedules.md, "Figures")."""

from benchmarks.command import BenchCommand
from benchmarks.sections import SCHEDULE_SECTIONS


class Command(BenchCommand):
    help = "Measure how late schedule ticks start with many schedules (p50/p99); every run is recorded."
    sections = SCHEDULE_SECTIONS
