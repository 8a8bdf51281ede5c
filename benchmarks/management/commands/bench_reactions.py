"""`manage.py bench_reactions`: reactions and projections, section by section (docs/bench-reactions.md)."""

from benchmarks.command import BenchCommand
from benchmarks.sections import REACTION_SECTIONS


class Command(BenchCommand):
    help = ("Measure reaction latency, claim contention, watermark-aware claims, projection replay and lane "
            "responsiveness on the configured database; every run is recorded.")
    sections = REACTION_SECTIONS
