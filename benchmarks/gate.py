"""The ratio gate: goals stated as ratios between cells measured in the SAME run, interleaved.

`bench_check` compares absolute p50s with a baseline taken earlier, which only means something on one
fixed machine. On a shared CI runner every absolute figure moves with the neighbours' load, but two
variants run back to back, in a rotating order, move together: their ratio is what the code decides.
So each rule here names two cells of one section (a numerator and a denominator), pairs their repeats
(repeat i of one with repeat i of the other, adjacent in time), and takes the median of the paired
ratios. A rule passes when that median is within its limit. It fails only when the median is beyond
the limit AND the repeats agree: at least three quarters of the paired ratios are beyond it too. A
median beyond the limit with repeats on both sides is *inconclusive*: said loudly and recorded, not
failed, because on a loaded machine (load 13 on 2 cores, during development) eager-lease repeats
ranged from -15 % to +20 % around a true cost of a few percent; a real regression moves every repeat.

The limits are set where the current code passes with a margin on a loaded 2-core machine (measured
figures and the issue's goals are in docs/results.md); where a goal of issue 15 is not met yet, the
rule gates what the code achieves today and says the goal beside it, so the gap stays visible.
Nothing here touches Django beyond reading cells, so the rules can be read and tested on their own.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from benchmarks.compare import Cell

#: Share of the paired repeats that must be beyond the limit (with the median) for a rule to fail.
AGREEMENT = 0.75


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
        "coalescer vs raw", "coalesced", {"writers": 64}, "coalesced-64", "raw-coalescer",
        "64 writers: Loom's coalescer (max_batch 64) against a minimal raw-psycopg coalescer running the same "
        "guarded statement on the same number of flush threads; what our Python costs per coalesced event",
        # Issue 33 asks the gate to hold 0.9; on this 2-core machine the paired ratio was 0.52-0.78 (medians
        # 0.62-0.70, docs/coalescing.md "Issue 33"): the gate holds what is reliably met, the goal beside it.
        # Wave 15 (binary array parameters, leaner request path): 0.57-1.77 paired, medians 0.65-0.84 in four
        # runs under load; still not reliably 0.9, so the limit stays.
        at_least=0.5, goal="coalesced-64 >= 0.9x the raw coalescer (issue 33; its table's goal is 1.0x): not met"),
    RatioRule(
        "eager lease cost", "lease", {"concurrency": 16, "shape": "noop", "ids": "caller"},
        "caller/noop/eager", "caller/noop/off",
        "one-step no-op runs (the worst case for a ratio): eager heartbeat leases against none; "
        "eager/off >= 0.80 is an overhead of at most 20 %", at_least=0.80,
        # The goal is 15 %; this cell's paired medians were 6.8-17.9 % in idle runs (docs/bench-leases.md)
        # and 14-16 % under load: at the line, so the gate sits at 20 % and prints the goal beside it.
        goal="eager lease overhead <= 15 % (eager/off >= 0.85): at the line on a 2-core machine, not gated"),
)


@dataclass(frozen=True)
class RatioOutcome:
    rule: RatioRule
    value: float | None  # None: a cell or its repeats were not measured
    paired: tuple[float, ...]

    @property
    def verdict(self) -> str:
        """ok, fail, or inconclusive (median beyond the limit, repeats not agreeing). Not measured is a
        failure: a gate that skips silently guards nothing."""
        if self.value is None:
            return "fail"
        if self.rule.passes(self.value):
            return "ok"
        beyond = sum(1 for ratio in self.paired if not self.rule.passes(ratio))
        return "fail" if beyond >= math.ceil(AGREEMENT * len(self.paired)) else "inconclusive"

    @property
    def failed(self) -> bool:
        return self.verdict == "fail"

    def line(self) -> str:
        rule = self.rule
        if self.value is None:
            return f"FAIL {rule.name}: {rule.numerator} / {rule.denominator} not measured (needs 2+ repeats of both)"
        verdict = {"ok": "ok  ", "fail": "FAIL", "inconclusive": "INCONCLUSIVE (not failed)"}[self.verdict]
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
