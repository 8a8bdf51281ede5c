"""The result pages' fixed charts in headless Chromium (issue 28): a section with 12 series keeps its whole plot
(the chart grows with its legend; y labels never closer than TICK_GAP), scenarios that each hold one point of the
swept parameter are drawn as one line over it, a cell measured once is flagged, the run list and the compare
header show the command's arguments, compare has a chart and hides the rows the runs do not share. With
LOOM_SCREENSHOTS=<dir> the pages are saved there (docs/results.md "Screenshots")."""

from __future__ import annotations

import re
from itertools import pairwise

import pytest

from benchmarks import charts
from benchmarks.command import run_link
from benchmarks.models import BenchRun
from benchmarks.recording import Recorder
from tests.admin.test_browser import CHROMIUM, browser_page, click_through  # noqa: F401  (the fixture)
from tests.queues.test_operations_browser import shot

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium "
                                                     "(install it with scripts/ensure-chromium)"),
]


def record(slow: float, extra: bool) -> int:
    with Recorder("bench_durable", {"ops": 10}) as rec:
        for conc in (1, 8, 32):  # 4 scenarios x 3 configs: 12 series, as the durable section records
            for steps in (1, 3, 10, 30):
                for config in ("plain", "coalesced", "lazy"):
                    tput = 100 * conc / steps / slow
                    rec.add("durable", f"{steps}-step", {"concurrency": conc, "steps": steps, "config": config},
                            throughput=tput, unit="exec/s", p50_ms=0.5 * steps * slow, p95_ms=steps * slow,
                            p99_ms=3.0 * steps * slow, max_ms=9.0 * steps * slow, count=20)
        for size in (1, 4, 16, 64):  # one scenario per swept value: one line, not four dots
            rec.add("batch-shape", f"batch-{size}", {"writers": 8, "events_per_statement": size},
                    throughput=5000.0 * size ** 0.5 / slow, unit="events/s", p50_ms=0.3 * size, p99_ms=size * 1.0,
                    count=64)
        rec.add("growth", "recovery sweep", {"events": 100000}, throughput=2.0, unit="ops/s", p50_ms=500.0,
                p99_ms=500.0, count=1)
        rec.add("growth", "append", {"events": 100000}, throughput=900.0, unit="ops/s", p50_ms=1.1, count=300)
        if extra:
            rec.add("read", "only-in-new", {"events": 10}, throughput=1.0, unit="reads/s", count=5)
    BenchRun.objects.filter(pk=rec.run.pk).update(argv=f"manage.py bench_durable --ops 10 --sections durable "
                                                      f"--tag {'new' if extra else 'base'}")
    return rec.run.pk


def plot_height(svg: str) -> float:
    """The y axis line's length: the plot's height."""
    x1 = re.search(r'<line x1="76" x2="76" y1="([\d.]+)" y2="([\d.]+)"', svg)
    return float(x1[2]) - float(x1[1])


@pytest.mark.django_db(transaction=True)
def test_result_charts_are_readable_and_compare_has_a_chart(live_server, browser_page, settings):  # noqa: F811
    settings.LOOM_RESULTS_PUBLIC = True
    base, new = record(1.0, False), record(1.3, True)
    page = browser_page
    page.set_viewport_size({"width": 1400, "height": 1000})
    page.goto(f"{live_server.url}/bench/runs/{new}/")
    svgs = page.locator("svg.chart").evaluate_all("nodes => nodes.map(n => n.outerHTML)")
    by_title = dict(zip(page.locator("figure.chart figcaption").all_inner_texts(), svgs, strict=True))
    durable = [svg for title, svg in by_title.items() if title.startswith("durable")]
    assert len(durable) == 2 and all(plot_height(svg) >= charts.PLOT for svg in durable)
    for svg in durable:  # y tick labels at least TICK_GAP apart
        ys = sorted(float(y) for y in re.findall(r'<text x="70" y="([\d.]+)" text-anchor="end" class="tick">', svg))
        assert ys and all(b - a >= charts.TICK_GAP for a, b in pairwise(ys))
    latency = next(svg for title, svg in by_title.items() if title.startswith("durable: latency"))
    assert latency.count('class="legend"') == 12  # one entry per series, not one per percentile line
    batch = next(svg for title, svg in by_title.items() if title.startswith("batch-shape: throughput"))
    (line,) = re.findall(r'<polyline class="series" points="([^"]+)"', batch)
    assert len(line.split()) == 4  # one series over events_per_statement
    once = page.locator("table.cells tr", has_text="recovery sweep")
    assert once.locator(".badge.once").inner_text() == "measured once"
    assert page.locator("table.cells tr", has_text="append").locator(".badge.once").count() == 0
    shot(page, "results-run.png")

    page.goto(f"{live_server.url}/bench/")
    assert "--tag new" in page.locator("tr", has_text=f"#{new}").inner_text()
    page.goto(f"{live_server.url}/bench/compare/{base}/{new}/")
    header = page.locator("table.pair").inner_text()
    assert "--tag base" in header and "--tag new" in header
    assert page.locator("#compare-chart svg line.reference").count() == 1
    assert page.locator("tr.added").count() == 1
    shot(page, "results-compare.png")
    page.locator("input[name=shared]").check()
    click_through(page.locator("form.filters button[type=submit]"))
    page.wait_for_url("**shared=1*")
    assert page.locator("tr.added").count() == 0
    assert page.locator("table.compare tbody tr").count() == 12 * 3 + 4 + 2


def test_the_printed_link_is_the_url_path_of_this_project(settings):
    assert run_link(7) == "browse it at /bench/runs/7/ on your site (LOOM_RESULTS_URL: a full link)"
    settings.LOOM_RESULTS_URL = "https://ops.example.com/"
    assert run_link(7) == "browse it at https://ops.example.com/bench/runs/7/"
