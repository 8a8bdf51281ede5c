"""The ratio gate: goals stated as ratios between cells measured in the SAME run, interleaved.

`bench_check` compares absolute p50s with a baseline taken earlier, which only means something on one
fixed machine. On a shared CI runner every absolute figure moves with the neighbours' load, but two
variants run back to back, in a rotating order, move together: their ratio is what the code decides.
So each rule here names two cells of one section (a numerator and a denominator), pairs their repeats
(repeat i of one with repeat i of the other, adjacent in time), and takes the median of the paired
ratios. A rule fails only when that median is on the wrong side of its limit.

The limits are set where the current code passes with a margin on a loaded 2-core machine (measured
figures and the issue's goals are in docs/results.md); where a goal of issue 15 is not met yet, the
rule gates what the code achieves today and says the goal beside it, so the gap stays visible.
Nothing here touches Django beyond reading cells, so the rules can be read and tested on their own.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from benchmarks.compare import Cell


@dataclass(frozen=True)
class RatioRule:
    """median(numerator_i / denominator_i) over paired repeats must be >= `at_least` (or <= `at_most`)."""

    name: str
    section: str
    params: dict
    numerator: str  # scenario
    denominator: str  # scenario
    why: str
    at_least: float | None = None
    at_most: float | None = None
    goal: str = ""  # the goal of the issue, when the limit is not (yet) the goal itself
    vendors: tuple[str, ...] = ("postgresql",)

    def limit_text(self) -> str:
        return f">= {self.at_least:g}" if self.at_least is not None else f"<= {self.at_most:g}"

    def passes(self, value: float) -> bool:
        if self.at_least is not None:
            return value >= self.at_least
        return value <= self.at_most  # type: ignore[operator]


RULES: tuple[RatioRule, ...] = (
    RatioRule(
        "append overhead", "append", {"concurrency": 1}, "ceiling", "per-event",
        "one writer: the raw driver's statement (no Django) over our fenced Event.objects.append; what our "
        "Python costs on top of the database's own work", at_most=1.5,
        goal="per-event append within 1.5x of its raw-driver ceiling"),
    RatioRule(
        "coalescing gain", "coalesced", {"writers": 64}, "coalesced-64", "per-event",
        "64 writers: the cross-stream coalescer against one statement (one notifying commit) per event",
        at_least=3.0, goal="coalesced >= 3x per-event at 64 writers"),
    RatioRule(
        "eager lease cost", "lease", {"concurrency": 16, "shape": "noop", "ids": "caller"},
        "caller/noop/eager", "caller/noop/off",
        "one-step no-op runs (the worst case for a ratio): eager heartbeat leases against none; "
        "eager/off >= 0.85 is an overhead of at most 15 %", at_least=0.85,
        goal="eager lease overhead <= 15 %"),
)


@dataclass(frozen=True)
class RatioOutcome:
    rule: RatioRule
    value: float | None  # None: a cell or its repeats were not measured
    paired: tuple[float, ...]

    @property
    def failed(self) -> bool:
        """Not measured fails too: a gate that skips silently guards nothing."""
        return self.value is None or not self.rule.passes(self.value)

    def line(self) -> str:
        rule = self.rule
        if self.value is None:
            return f"FAIL {rule.name}: {rule.numerator} / {rule.denominator} not measured (needs 2+ repeats of both)"
        verdict = "FAIL" if self.failed else "ok  "
        spread = f"{min(self.paired):.3f}..{max(self.paired):.3f}"
        goal = f"; goal: {rule.goal}" if rule.goal else ""
        return (f"{verdict} {rule.name}: {rule.numerator} / {rule.denominator} = {self.value:.3f} "
                f"(median of {len(self.paired)} paired repeats, {spread}), limit {rule.limit_text()}{goal}")


def _matches(cell: Cell, rule: RatioRule, scenario: str) -> bool:
    return (cell.section == rule.section and cell.scenario == scenario
            and all(cell.params.get(k) == v for k, v in rule.params.items()))


def evaluate(cells: Iterable[Cell], rules: Iterable[RatioRule] = RULES) -> list[RatioOutcome]:
    """Each rule over the cells of one run: the median of the paired per-repeat ratios."""
    cells = list(cells)
    outcomes = []
    for rule in rules:
        top = next((c for c in cells if _matches(c, rule, rule.numerator)), None)
        bottom = next((c for c in cells if _matches(c, rule, rule.denominator)), None)
        paired: tuple[float, ...] = ()
        if top is not None and bottom is not None:
            paired = tuple(t / b for t, b in zip(top.throughput_runs, bottom.throughput_runs, strict=False) if b > 0)
        value = statistics.median(paired) if len(paired) >= 2 else None
        outcomes.append(RatioOutcome(rule, value, paired))
    return outcomes


def rules_for(vendor: str) -> tuple[RatioRule, ...]:
    return tuple(rule for rule in RULES if vendor in rule.vendors)
