"""Plain-text tables of recorded results, for the terminal and the docs (Markdown)."""

from __future__ import annotations

from collections.abc import Sequence

#: Text figures shown in the tables: a verdict qualifies the numbers beside it ("spread too wide").
TEXT_METRICS = ("verdict",)


def _fmt(value, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.{digits}f}"
    return str(value)


def format_results(run, results: Sequence, heading: str = "##") -> str:
    """A Markdown table per section (under `heading`): scenario, parameters, throughput, latency
    percentiles, extras."""
    lines = [f"\n{run.command} run #{run.pk} on {run.db_version} ({run.cpu_count} CPUs, commit "
             f"{(run.git_commit or 'unknown')[:10]}{' dirty' if run.git_dirty else ''})"]
    sections: dict[str, list] = {}
    for result in results:
        sections.setdefault(result.section, []).append(result)
    for section, rows in sections.items():
        extra_keys = sorted({k for r in rows for k, v in r.metrics.items()
                             if isinstance(v, (int, float)) or (k in TEXT_METRICS and v)})
        header = ["scenario", "params", "throughput", "unit", "p50 ms", "p95 ms", "p99 ms", "max ms", *extra_keys]
        lines.append(f"\n{heading} {section}\n")
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "---|" * len(header))
        for r in rows:
            params = ", ".join(f"{k}={v}" for k, v in r.params.items())
            cells = [r.scenario, params, _fmt(r.throughput, 1), r.unit, _fmt(r.p50_ms), _fmt(r.p95_ms),
                     _fmt(r.p99_ms), _fmt(r.max_ms), *(_fmt(r.metrics.get(k)) for k in extra_keys)]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
