"""`manage.py bench_reactions`: reactions and projections, section by section (docs/bench-reactions.md)."""

from types import SimpleNamespace

from benchmarks import reaction_scenarios
from benchmarks.command import BenchCommand


class Command(BenchCommand):
    help = ("Measure reaction latency, claim contention, watermark-aware claims, projection replay and lane "
            "responsiveness on the configured database; every run is recorded.")
    sections = {name: f"benchmarks.reaction_scenarios:{name}" for name in reaction_scenarios.SECTIONS}

    def _modules(self) -> dict:
        # The sections are functions of one module; the first carries the shared command-line options.
        modules = {name: SimpleNamespace(run=fn) for name, fn in reaction_scenarios.SECTIONS.items()}
        next(iter(modules.values())).add_arguments = reaction_scenarios.add_arguments
        return modules
