"""Server-rendered SVG charts of recorded cells: throughput against a swept parameter, and latency
percentiles. Hand-written SVG rather than a charting library: two chart shapes are all the pages
need, the markup is a few hundred lines we control (escaping, colours, no script), it adds no
dependency and it renders the same in every browser and without JavaScript. Tooltips are SVG
`<title>` elements, which browsers show natively.

`section_charts(cells)` decides what to draw for any section of any bench command, from the cells
alone: if a numeric parameter is swept (concurrency preferred), lines against it; otherwise bars.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from benchmarks.compare import Cell

# Okabe-Ito: distinguishable with the common colour-vision deficiencies.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")
PERCENTILES = (("p50_ms", "p50"), ("p95_ms", "p95"), ("p99_ms", "p99"))
WIDTH, HEIGHT = 640, 300
LEFT, RIGHT, TOP, BOTTOM = 76, 16, 40, 60  # room for 13-14px labels (results.css)
# The plot's own height, whatever the legend takes above it: the chart grows with its legend rather than the plot
# shrinking (12 legend rows left ~20 px of plot, issue 28). HEIGHT is the chart with a one-row legend.
PLOT = HEIGHT - TOP - BOTTOM
TICK_GAP = 14  # px: a y tick label closer than this to the previous one drawn is left out (no overlap)


@dataclass(frozen=True)
class Chart:
    title: str
    svg: str  # already escaped markup


@dataclass(frozen=True)
class Series:
    name: str
    points: dict  # x category -> y value
    dashed: bool = False
    color: str = PALETTE[0]


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value / 1000:g}k" if value % 1000 == 0 else f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.0f}"
    if abs(value) >= 1:
        return f"{value:.3g}"
    return f"{value:.2g}"


def _nice_max(value: float) -> float:
    """The smallest 1/2/2.5/5 x 10^k at or above value, so the top tick is a round number."""
    if value <= 0:
        return 1.0
    base = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * base:
            return step * base
    return 10 * base


class _Scale:
    """Maps a value to a y pixel, linear from 0 or logarithmic over whole decades."""

    def __init__(self, values: Sequence[float], log: bool, top: float = TOP, bottom: float = HEIGHT - BOTTOM):
        positive = [v for v in values if v is not None and v > 0]
        self.log = log and len(positive) > 0
        if self.log:
            self.lo = 10 ** math.floor(math.log10(min(positive)))
            self.hi = 10 ** math.ceil(math.log10(max(positive)))
            if self.hi <= self.lo:
                self.hi = self.lo * 10
        else:
            self.lo, self.hi = 0.0, _nice_max(max(positive, default=1.0))
        self.top, self.bottom = top, bottom

    def y(self, value: float) -> float:
        if self.log:
            value = max(value, self.lo)
            frac = (math.log10(value) - math.log10(self.lo)) / (math.log10(self.hi) - math.log10(self.lo))
        else:
            frac = value / self.hi
        return self.bottom - frac * (self.bottom - self.top)

    def ticks(self) -> list[float]:
        if self.log:
            count = round(math.log10(self.hi / self.lo))
            return [self.lo * 10**i for i in range(count + 1)]
        return [self.hi * i / 5 for i in range(6)]


def _frame(scale: _Scale, y_label: str, x_label: str, title: str) -> list[str]:
    height = scale.bottom + BOTTOM
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {WIDTH} {height:.0f}" '
        f'width="{WIDTH}" height="{height:.0f}" role="img" aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
        f'<rect x="0" y="0" width="{WIDTH}" height="{height:.0f}" fill="#fff"/>',
    ]
    last_label = None
    for tick in scale.ticks():
        y = scale.y(tick)
        parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e5e7eb"/>')
        if last_label is None or abs(last_label - y) >= TICK_GAP:
            parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" class="tick">{_fmt(tick)}</text>')
            last_label = y
    parts.append(f'<line x1="{LEFT}" x2="{LEFT}" y1="{scale.top}" y2="{scale.bottom}" stroke="#9ca3af"/>')
    parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{scale.bottom}" y2="{scale.bottom}" '
                 'stroke="#9ca3af"/>')
    mid = (scale.top + scale.bottom) / 2
    scale_note = " (log)" if scale.log else ""
    parts.append(f'<text transform="translate(14 {mid:.0f}) rotate(-90)" text-anchor="middle" class="axis">'
                 f"{escape(y_label + scale_note)}</text>")
    parts.append(f'<text x="{(LEFT + WIDTH - RIGHT) / 2:.0f}" y="{height - 8:.0f}" text-anchor="middle" '
                 f'class="axis">{escape(x_label)}</text>')
    return parts


def _legend(series: Sequence[tuple[str, str, bool]]) -> tuple[list[str], float]:
    """Legend entries (name, colour, dashed) laid out left to right across the top; and the y
    where the plot can start below them."""
    parts, x, y = [], LEFT, 16
    for name, color, dashed in series:
        width = 30 + 7.8 * len(name)  # 13px legend text
        if x + width > WIDTH - RIGHT and x > LEFT:
            x, y = LEFT, y + 17
        dash = ' stroke-dasharray="5 3"' if dashed else ""
        parts.append(f'<line x1="{x}" x2="{x + 18}" y1="{y - 4}" y2="{y - 4}" stroke="{color}" '
                     f'stroke-width="3"{dash}/>')
        parts.append(f'<text x="{x + 22}" y="{y}" class="legend">{escape(name)}</text>')
        x += width
    return parts, y + 16


def line_chart(title: str, x_label: str, x_values: Sequence, series: Sequence[Series], y_label: str,
               log: bool = False, legend_entries: Sequence[tuple[str, str, bool]] | None = None) -> str:
    """Lines over ordinal x categories (equally spaced: 1, 8, 32, 256 read well without a log axis). The plot
    is PLOT px high below however many legend rows (`legend_entries`: default one per series)."""
    legend, top = _legend(legend_entries if legend_entries is not None else [(s.name, s.color, s.dashed)
                                                                             for s in series])
    scale = _Scale([v for s in series for v in s.points.values()], log, top, top + PLOT)
    bottom = scale.bottom
    parts = _frame(scale, y_label, x_label, title)
    span = WIDTH - RIGHT - LEFT - 40
    step = span / max(len(x_values) - 1, 1)
    xs = {x: LEFT + 20 + i * step for i, x in enumerate(x_values)}
    for x, px in xs.items():
        parts.append(f'<text x="{px:.1f}" y="{bottom + 16:.1f}" text-anchor="middle" class="tick">'
                     f"{escape(str(x))}</text>")
    for s in series:
        points = [(xs[x], scale.y(y), x, y) for x, y in ((x, s.points.get(x)) for x in x_values) if y is not None]
        if not points:
            continue
        dash = ' stroke-dasharray="5 3"' if s.dashed else ""
        path = " ".join(f"{px:.1f},{py:.1f}" for px, py, _, _ in points)
        parts.append(f'<polyline class="series" points="{path}" fill="none" stroke="{s.color}" '
                     f'stroke-width="2"{dash}/>')
        for px, py, x, y in points:
            parts.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3.5" fill="{s.color}">'
                         f"<title>{escape(s.name)} at {escape(x_label)}={escape(str(x))}: {_fmt(y)} "
                         f"{escape(y_label)}</title></circle>")
    parts += legend
    parts.append("</svg>")
    return "".join(parts)


def bar_chart(title: str, categories: Sequence[str], groups: Sequence[tuple[str, Sequence[float | None]]],
              y_label: str, log: bool = False, reference: float | None = None) -> str:
    """Grouped bars: one group per category, one bar per (name, values) entry of `groups`; `reference`: a grey
    horizontal line at that value (a ratio's 1x)."""
    legend, top = _legend([(name, PALETTE[j % len(PALETTE)], False) for j, (name, _) in enumerate(groups)])
    scale = _Scale([v for _, values in groups for v in values if v is not None], log, top, top + PLOT)
    bottom = scale.bottom
    parts = _frame(scale, y_label, "", title)
    span = WIDTH - RIGHT - LEFT
    slot = span / max(len(categories), 1)
    bar = min(28.0, slot * 0.8 / max(len(groups), 1))
    rotate = len(categories) > 5 or max((len(c) for c in categories), default=0) * 7.5 > slot
    for i, category in enumerate(categories):
        cx = LEFT + slot * (i + 0.5)
        start = cx - bar * len(groups) / 2
        for j, (name, values) in enumerate(groups):
            value = values[i]
            if value is None:
                continue
            y = scale.y(value)
            parts.append(f'<rect class="bar" x="{start + j * bar:.1f}" y="{y:.1f}" width="{bar - 1:.1f}" '
                         f'height="{max(bottom - y, 0.5):.1f}" fill="{PALETTE[j % len(PALETTE)]}">'
                         f"<title>{escape(category)} {escape(name)}: {_fmt(value)} {escape(y_label)}</title></rect>")
        label = escape(category if len(category) <= 28 else category[:27] + "…")
        if rotate:
            parts.append(f'<text transform="translate({cx:.1f} {bottom + 12:.1f}) rotate(-25)" '
                         f'text-anchor="end" class="tick">{label}</text>')
        else:
            parts.append(f'<text x="{cx:.1f}" y="{bottom + 16:.1f}" text-anchor="middle" class="tick">'
                         f"{label}</text>")
    if reference is not None:
        y = scale.y(reference)
        parts.append(f'<line class="reference" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" '
                     f'stroke="#6b7280" stroke-width="1.5" stroke-dasharray="4 3"/>')
    parts += legend
    parts.append("</svg>")
    return "".join(parts)


COMPARE_MAX = 24  # sections the compare chart draws at most (the tables below have every cell)


def _geomean(values: Sequence[float]) -> float | None:
    positive = [v for v in values if v is not None and v > 0]
    return math.exp(sum(math.log(v) for v in positive) / len(positive)) if positive else None


def compare_chart(title: str, rows: Sequence) -> str:
    """The compare page's chart: per section, the geometric mean of the throughput and p50 ratios (new ÷ base)
    of the cells both runs have, as bars around a 1x line (log scale: 0.5x and 2x are as far from it); one bar
    per section stays readable where one per cell (a section has dozens) would not. "" when no ratio."""
    by_section: dict[str, list] = {}
    for r in rows:
        if r.status not in ("added", "removed"):
            by_section.setdefault(r.cell.section, []).append(r)
    sections = [name for name, found in by_section.items()
                if any(r.throughput_ratio is not None or r.p50_ratio is not None for r in found)][:COMPARE_MAX]
    if not sections:
        return ""
    labels = [f"{name} ({len(by_section[name])})" for name in sections]
    groups = [("throughput ratio (higher is better)",
               [_geomean([r.throughput_ratio for r in by_section[name]]) for name in sections]),
              ("p50 ratio (lower is better)", [_geomean([r.p50_ratio for r in by_section[name]]) for name in sections])]
    return bar_chart(title, labels, groups, "new ÷ base", log=True, reference=1.0)


def _numeric(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def sweep_param(cells: Sequence[Cell]) -> str | None:
    """The parameter the section sweeps: numeric with more than one value; `concurrency` preferred."""
    values: dict[str, set] = {}
    for cell in cells:
        for k, v in cell.params.items():
            values.setdefault(k, set()).add(v if _numeric(v) else None)
    swept = [k for k, vs in values.items() if None not in vs and len(vs) > 1]
    if not swept:
        return None
    if "concurrency" in swept:
        return "concurrency"
    return max(swept, key=lambda k: (len(values[k]), k))


def _series_name(cell: Cell, varying: Sequence[str]) -> str:
    extra = ", ".join(f"{k}={cell.params[k]}" for k in varying if k in cell.params)
    return f"{cell.scenario} ({extra})" if extra else cell.scenario


def _label(cell: Cell, varying: Sequence[str]) -> str:
    extra = " ".join(f"{k}={cell.params[k]}" for k in varying if k in cell.params)
    return f"{cell.scenario} {extra}".strip()


def _varying_within_scenario(cells: Sequence[Cell], sweep: str | None) -> list[str]:
    """Params that take several values among cells of one scenario at one sweep value: they split a
    scenario into several series (or label its bars). Params that follow the sweep (connections =
    concurrency) or are fixed per scenario (events_per_call) do not."""
    groups: dict[tuple, dict[str, set]] = {}
    for cell in cells:
        group = groups.setdefault((cell.scenario, repr(cell.params.get(sweep))), {})
        for k, v in cell.params.items():
            group.setdefault(k, set()).add(repr(v))
    keys = {k for params in groups.values() for k, vs in params.items() if len(vs) > 1 and k != sweep}
    return sorted(keys)


def _one_series(section: str, series: list[Series]) -> list[Series]:
    """Scenarios that each hold one point of the sweep (batch-1, batch-4...: the scenario's name is the swept
    value) are one series over the parameter, not single dots (issue 28); anything else is left as it is."""
    if len(series) < 2 or any(len(one.points) != 1 for one in series):
        return series
    xs = [x for one in series for x in one.points]
    if len(set(map(repr, xs))) != len(xs):
        return series  # two scenarios at one x: not one series
    first = series[0]
    return [Series(section, {x: y for one in series for x, y in one.points.items()}, first.dashed, first.color)]


def section_charts(section: str, cells: Sequence[Cell]) -> list[Chart]:
    """Charts for one section's cells: throughput (per unit) and latency percentiles."""
    charts: list[Chart] = []
    sweep = sweep_param(cells)
    varying = _varying_within_scenario(cells, sweep)
    units: dict[str, list[Cell]] = {}
    for cell in cells:
        if cell.throughput is not None:
            units.setdefault(cell.unit or "ops/s", []).append(cell)
    timed = [c for c in cells if any(getattr(c, attr) is not None for attr, _ in PERCENTILES)]

    if sweep:
        xs = sorted({c.params[sweep] for c in cells if sweep in c.params})
        for unit, group in units.items():
            series: dict[str, Series] = {}
            for cell in group:
                name = _series_name(cell, varying)
                color = PALETTE[len(series) % len(PALETTE)] if name not in series else series[name].color
                points = dict(series[name].points) if name in series else {}
                if sweep in cell.params:
                    points[cell.params[sweep]] = cell.throughput
                series[name] = Series(name, points, color=color)
            title = f"{section}: throughput vs {sweep}"
            charts.append(Chart(title, line_chart(title, sweep, xs, _one_series(section, list(series.values())),
                                                  unit)))
        if timed:
            names: list[str] = []
            for cell in timed:
                if _series_name(cell, varying) not in names:
                    names.append(_series_name(cell, varying))
            lines = []
            for attr, label, dashed in (("p50_ms", "p50", False), ("p99_ms", "p99", True)):
                per_name = [Series(name, {c.params[sweep]: getattr(c, attr) for c in timed
                                          if _series_name(c, varying) == name and sweep in c.params},
                                   dashed=dashed, color=PALETTE[i % len(PALETTE)]) for i, name in enumerate(names)]
                lines += [Series(f"{one.name} {label}", one.points, one.dashed, one.color)
                          for one in _one_series(section, per_name)]
            # One legend entry per series (its colour); solid p50 and dashed p99 are said once, in the title.
            entries = list({line.name.rsplit(" ", 1)[0]: (line.name.rsplit(" ", 1)[0], line.color, False)
                            for line in lines}.values())
            title = f"{section}: latency p50 (solid) and p99 (dashed) vs {sweep}"
            charts.append(Chart(title, line_chart(title, sweep, xs, lines, "ms", log=True, legend_entries=entries)))
        return charts

    for unit, group in units.items():
        title = f"{section}: throughput"
        labels = [_label(c, varying) for c in group]
        charts.append(Chart(title, bar_chart(title, labels, [(unit, [c.throughput for c in group])], unit)))
    if timed:
        title = f"{section}: latency percentiles"
        labels = [_label(c, varying) for c in timed]
        groups = [(label, [getattr(c, attr) for c in timed]) for attr, label in PERCENTILES]
        charts.append(Chart(title, bar_chart(title, labels, groups, "ms", log=True)))
    return charts
