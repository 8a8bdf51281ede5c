"""The compare page judges a difference against the measured spread of repeats, and says which way is better.

Two back-to-back runs of the same code on a shared machine differ by up to 2x in a multi-writer cell; the
page used to call that an "improvement". A cell is now a regression or an improvement only when the change
is past the threshold and every repeat of the new run lies beyond every repeat of the base run.
"""

from __future__ import annotations

import io
import re
import statistics
from pathlib import Path

import pytest
from django.urls import reverse

from benchmarks import charts
from benchmarks.compare import Cell, compare, judge
from benchmarks.recording import Recorder

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def public(settings):
    settings.LOOM_RESULTS_PUBLIC = True


def record(throughput: float, runs: list[float] | None, p50: float = 1.0, p50_runs: list[float] | None = None):
    with Recorder("bench_throughput", {}) as rec:
        extra = {} if runs is None else {"runs": runs}
        if p50_runs is not None:
            extra["p50_runs"] = p50_runs
        rec.add("append", "per-event", {"concurrency": 64}, throughput=throughput, unit="events/s", p50_ms=p50,
                p95_ms=p50, p99_ms=p50 * 2, max_ms=p50 * 3, count=100, **extra)
    return rec.run


def test_a_2x_difference_inside_the_spread_of_repeats_is_noise():
    """Medians 2x apart, but the repeats overlap: neither improvement nor regression."""
    base = Cell("append", "per-event", {"c": 64}, throughput=1000.0, throughput_runs=(500.0, 1000.0, 2100.0))
    new = Cell("append", "per-event", {"c": 64}, throughput=2000.0, throughput_runs=(900.0, 2000.0, 2600.0))
    status, note = judge(base, new, 1.5)
    assert status == "noise"
    assert "within the spread of repeats" in note and "500..2100" in note


def test_separated_repeats_past_the_threshold_are_judged():
    """Every new repeat below every base repeat (and past 1.5x): a regression; the other way: an improvement."""
    base = Cell("a", "x", throughput=1000.0, throughput_runs=(950.0, 1000.0, 1050.0))
    slow = Cell("a", "x", throughput=500.0, throughput_runs=(480.0, 500.0, 520.0))
    assert judge(base, slow, 1.5) == ("regression", "")
    assert judge(slow, base, 1.5) == ("improvement", "")
    # Separated but within the threshold: the same.
    close = Cell("a", "x", throughput=1100.0, throughput_runs=(1090.0, 1100.0, 1110.0))
    assert judge(base, close, 1.5) == ("same", "")


def test_p50_is_judged_by_its_own_repeats_and_lower_is_better():
    """p50 2x higher with separated p50 repeats is a regression even if throughput did not move."""
    base = Cell("a", "x", throughput=100.0, p50_ms=1.0, throughput_runs=(99.0, 101.0), p50_runs=(0.95, 1.05))
    new = Cell("a", "x", throughput=100.0, p50_ms=2.0, throughput_runs=(99.0, 101.0), p50_runs=(1.9, 2.1))
    assert judge(base, new, 1.5)[0] == "regression"
    assert judge(new, base, 1.5)[0] == "improvement"


def test_a_cell_measured_once_has_no_spread_and_is_not_judged():
    """One repeat each: a 2x difference is reported as noise, with the reason."""
    base = Cell("a", "x", throughput=1000.0)
    new = Cell("a", "x", throughput=2000.0)
    status, note = judge(base, new, 1.5)
    assert status == "noise" and "no spread of repeats was measured" in note
    assert [r.status for r in compare([base], [new])] == ["noise"]


def test_the_lease_sections_samples_are_its_spread():
    """bench_lease records its repeats as `samples`: they are read as the throughput spread."""

    class Result:
        section, scenario, params, throughput, unit = "lease", "caller/noop/eager", {}, 10.0, "exec/s"
        p50_ms = p95_ms = p99_ms = max_ms = count = None
        metrics = {"samples": [9.0, 10.0, 11.0]}

    assert Cell.from_result(Result()).throughput_runs == (9.0, 10.0, 11.0)


@pytest.mark.django_db
def test_identical_back_to_back_runs_are_not_labelled_an_improvement(client, public):
    """The reported case: two runs of the same code, 2x apart in their medians, overlapping repeats."""
    base = record(1000.0, [520.0, 1000.0, 2050.0])
    new = record(2000.0, [950.0, 2000.0, 2300.0])
    html = client.get(reverse("benchmarks:compare", args=[base.pk, new.pk])).content.decode()
    assert "2.00\u00d7" in html
    assert '<tr class="improvement">' not in html and '<tr class="noise">' in html
    assert "0 improvements" in html and "1 within noise" in html
    assert "within the spread of repeats" in html


@pytest.mark.django_db
def test_compare_page_says_which_direction_is_better_per_ratio_column(client, public):
    """Throughput ratio: higher is better; p50 and p99 ratios: lower is better, in the column headers."""
    base = record(1000.0, [990.0, 1000.0, 1010.0])
    new = record(400.0, [395.0, 400.0, 405.0])
    html = client.get(reverse("benchmarks:compare", args=[base.pk, new.pk])).content.decode()
    head = html[html.index("<thead><tr>\n      <th>scenario"):]
    head = head[:head.index("</thead>")]
    assert re.search(r"thr\. ratio<br><small class=\"direction\">higher is better</small>", head)
    assert re.search(r"p50 ratio<br><small class=\"direction\">lower is better</small>", head)
    assert re.search(r"p99 ratio<br><small class=\"direction\">lower is better</small>", head)
    assert '<tr class="regression">' in html


def test_chart_text_is_large_enough_to_read():
    """Ticks, legends and axis titles: at least 13 px in the chart's own units (results.css), and the
    charts use the classes the stylesheet sizes."""
    css = (ROOT / "benchmarks" / "static" / "benchmarks" / "results.css").read_text()
    sizes = dict(re.findall(r"svg\.chart text(\.\w+)? \{[^}]*?(\d+)px", css))
    assert sizes and all(int(px) >= 13 for px in sizes.values()), sizes
    cells = [Cell("append", "per-event", {"concurrency": n}, throughput=100.0 * n, unit="events/s", p50_ms=1.0,
                  p99_ms=2.0) for n in (1, 8, 64)]
    svg = charts.section_charts("append", cells)[0].svg
    assert 'class="tick"' in svg and 'class="axis"' in svg and 'class="legend"' in svg


# --- the ratio gate (benchmarks/gate.py, manage.py bench_gate) ---------------------------------------


def _pair(section: str, params: dict, top: str, bottom: str, top_runs, bottom_runs) -> list[Cell]:
    return [Cell(section, top, params, throughput=statistics.median(top_runs), throughput_runs=tuple(top_runs)),
            Cell(section, bottom, params, throughput=statistics.median(bottom_runs),
                 throughput_runs=tuple(bottom_runs))]


def test_the_gate_takes_the_median_of_paired_repeats():
    """Repeat i of the numerator over repeat i of the denominator; one wild repeat does not decide."""
    from benchmarks.gate import RULES, evaluate

    coalescing = next(r for r in RULES if r.name == "coalescing gain")
    cells = _pair("coalesced", {"writers": 64, "repeats": 5}, "coalesced-64", "per-event",
                  [4000, 4200, 900, 4100, 3900], [1000, 1000, 1000, 1000, 1000])
    (outcome,) = evaluate(cells, [coalescing])
    assert outcome.value == pytest.approx(4.0) and not outcome.failed
    assert outcome.paired == pytest.approx((4.0, 4.2, 0.9, 4.1, 3.9))
    cells = _pair("coalesced", {"writers": 64}, "coalesced-64", "per-event", [2000, 2500, 2900], [1000] * 3)
    assert evaluate(cells, [coalescing])[0].verdict == "fail"


def test_a_median_beyond_the_limit_with_disagreeing_repeats_is_inconclusive_not_failed():
    """Median 2.8x against a 3x limit, but two of five repeats well above it: the machine's noise, not a
    verdict on the code. Four of five beyond (with the median): a failure."""
    from benchmarks.gate import RULES, evaluate

    coalescing = next(r for r in RULES if r.name == "coalescing gain")
    noisy = _pair("coalesced", {"writers": 64}, "coalesced-64", "per-event", [2000, 2500, 4000, 4100, 2800],
                  [1000] * 5)
    (outcome,) = evaluate(noisy, [coalescing])
    assert outcome.value == pytest.approx(2.8) and outcome.verdict == "inconclusive" and not outcome.failed
    assert "INCONCLUSIVE" in outcome.line()
    agreeing = _pair("coalesced", {"writers": 64}, "coalesced-64", "per-event", [2000, 2500, 4000, 2900, 2800],
                     [1000] * 5)
    assert evaluate(agreeing, [coalescing])[0].failed


def test_the_gate_fails_a_rule_that_was_not_measured_or_measured_once():
    """No cells, or a single repeat (no pairing possible): FAIL, not a silent pass."""
    from benchmarks.gate import RULES, evaluate

    assert all(o.failed and o.value is None for o in evaluate([], RULES))
    append = next(r for r in RULES if r.name == "append overhead")
    once = _pair("append", {"concurrency": 1}, "ceiling", "per-event", [1100], [1000])
    assert evaluate(once, [append])[0].failed
    ok = _pair("append", {"concurrency": 1}, "ceiling", "per-event", [1100, 1200, 1150], [1000, 1000, 1000])
    assert not evaluate(ok, [append])[0].failed  # at most 1.5: the ceiling is 1.15x our append
    slow = _pair("append", {"concurrency": 1}, "ceiling", "per-event", [3000, 3100, 2900], [1000, 1000, 1000])
    assert evaluate(slow, [append])[0].failed


def test_bench_gate_records_a_gate_cell_per_rule_and_exits_1_only_when_one_fails(transactional_db):
    """At tiny sizes the ratios are anything; what must hold is that the run is recorded (ok), each rule
    of this database has its cell, and the exit status agrees with the cells: CommandError(1) naming
    exactly the failed rules, or success when all passed."""
    from django.core.management import call_command
    from django.core.management.base import CommandError
    from django.db import connection

    from benchmarks.gate import rules_for
    from benchmarks.models import BenchRun
    from leases.keeper import get_keeper, reset_keeper

    out = io.StringIO()
    error = None
    try:
        call_command("bench_gate", "--gate-repeats", "2", "--ops", "16", "--coalesce-writers", "3",
                     "--lease-concurrency", "2", "--lease-execs", "4", "--quiet", stdout=out, stderr=io.StringIO())
    except CommandError as exc:
        error = exc
    finally:  # the process's lease keeper must not outlive the test database (see test_bench_smoke.py)
        get_keeper().shutdown()
        reset_keeper(None)
    run = BenchRun.objects.filter(command="bench_gate").order_by("-id").first()
    assert run is not None and run.status == BenchRun.Status.OK, run and run.error
    gates = {r.scenario: r for r in run.results.filter(section="gate")}
    rules = rules_for(connection.vendor)
    assert set(gates) == {rule.name for rule in rules}
    failed = sorted(name for name, cell in gates.items() if not cell.metrics["passed"])
    if failed:
        assert error is not None and error.returncode == 1
        assert all(name in str(error) for name in failed)
    else:
        assert error is None and "within their limits" in out.getvalue()


@pytest.mark.django_db
def test_run_page_shows_vs_eventsourcing_and_vs_dbos_columns(client, public):
    """A peers run's cells carry ours ÷ theirs; the run page names those columns after the peer."""
    with Recorder("bench_throughput", {}) as rec:
        for name, peer in (("ours: aggregate do()", "eventsourcing"), ("eventsourcing", "eventsourcing"),
                           ("ours: durable one-step flow", "dbos"), ("DBOS one-step workflow", "dbos")):
            rec.add("peers", name, {"peer": peer, "concurrency": 8}, throughput=100.0, unit="exec/s", p50_ms=1.0,
                    count=10, runs=[99.0, 101.0], **{f"vs_{peer}": 2.5})
    html = client.get(reverse("benchmarks:run_detail", args=[rec.run.pk])).content.decode()
    assert ">vs eventsourcing</th>" in html and ">vs DBOS</th>" in html and "2.5" in html
