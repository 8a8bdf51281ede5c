"""`manage.py bench_gate`: the ratio gate CI runs, robust to a noisy shared machine (benchmarks/gate.py).

    manage.py bench_gate                  # append c=1, coalesced at 64 writers, lease c=16; 5 interleaved repeats

Runs the append, coalesced and lease sections at gate sizes, each variant interleaved with the one
it is compared with, records the run like any bench command (plus one `gate` cell per rule), then
checks every rule of benchmarks/gate.py: the median of the paired per-repeat ratios against its
limit, failing only when the repeats agree (see benchmarks/gate.py). Exit 0 when every rule passes
or is inconclusive, 1 when one fails or was not measured (the run is still recorded, status ok:
the measurement worked, the code missed its ratio), 2 on bad arguments.
Absolute p50s against a baseline file are `bench_check`'s job, on one fixed machine only.
"""

from __future__ import annotations

from django.core.management.base import CommandError

from benchmarks.arguments import positive_int
from benchmarks.command import BenchCommand
from benchmarks.compare import Cell
from benchmarks.gate import evaluate, rules_for
from benchmarks.sections import THROUGHPUT_SECTIONS

GATE_REPEATS = 5


class Command(BenchCommand):
    help = ("Fail (exit 1) when a ratio measured within this run (append overhead against the raw driver, "
            "coalescing gain at 64 writers, eager lease cost) misses its limit; every run is recorded.")
    sections = {name: THROUGHPUT_SECTIONS[name] for name in ("append", "coalesced", "lease")}

    def add_arguments(self, parser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--gate-repeats", type=positive_int, default=GATE_REPEATS,
                            help=f"Interleaved repeats of every compared pair; medians are gated "
                                 f"(default {GATE_REPEATS}).")
        # Gate sizes: long enough that one repeat is not a handful of scheduler ticks, short enough for CI.
        parser.set_defaults(concurrency=[1], ops=200, coalesce_writers=64, lease_concurrency=[16], lease_execs=300,
                            lease_shapes=["noop"], lease_ids=["caller"])

    def handle(self, *args, **options) -> None:
        repeats = options["gate_repeats"]
        options.update(append_repeats=repeats, repeats=repeats, lease_repeats=repeats)
        self._outcomes: list = []
        super().handle(*args, **options)

    def finish(self, recorder, options: dict) -> None:
        from django.db import connection

        rules = rules_for(connection.vendor)
        if not rules:
            self.stdout.write(f"bench_gate: no ratio is gated on {connection.vendor} (the limits are set for "
                              "PostgreSQL); the figures are recorded")
        self._outcomes = evaluate((Cell.from_result(r) for r in recorder.results), rules)
        for outcome in self._outcomes:
            recorder.add("gate", outcome.rule.name, {"numerator": outcome.rule.numerator,
                                                     "denominator": outcome.rule.denominator},
                         unit="ratio", ratio=outcome.value, limit=outcome.rule.limit_text(),
                         passed=not outcome.failed, verdict=outcome.verdict, paired=list(outcome.paired),
                         goal=outcome.rule.goal)

    def conclude(self, recorder, options: dict) -> None:
        self.stdout.write(f"bench_gate: run #{recorder.run.pk}, ratios within the run")
        for outcome in self._outcomes:
            self.stdout.write("  " + outcome.line())
        failed = [o for o in self._outcomes if o.failed]
        if failed:
            raise CommandError(f"{len(failed)} of {len(self._outcomes)} ratio(s) missed their limit: "
                               + ", ".join(o.rule.name for o in failed), returncode=1)
        unsure = [o.rule.name for o in self._outcomes if o.verdict == "inconclusive"]
        if unsure:
            self.stdout.write(f"bench_gate: inconclusive (median beyond the limit, repeats disagree; not failed): "
                              f"{', '.join(unsure)}")
        self.stdout.write(f"bench_gate: {len(self._outcomes) - len(unsure)} ratio(s) within their limits")
