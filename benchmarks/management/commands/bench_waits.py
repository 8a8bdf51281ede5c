"""`manage.py bench_waits`: flows that wait: timer lateness, message round trips, idle flows (docs/flows.md)."""

from benchmarks.command import BenchCommand
from benchmarks.sections import WAITS_SECTIONS


class Command(BenchCommand):
    help = ("Measure durable timers' wake-up lateness (1,000 and 100,000 pending), message round trips "
            "(1 and 64 flows) and 10,000 sleeping flows in one worker; every run is recorded.")
    sections = WAITS_SECTIONS
