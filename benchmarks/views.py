"""Result pages: the list of runs, one run's tables and charts, a comparison of two runs, exports.

Thin glue: the comparison rules live in benchmarks/compare.py, the charts in benchmarks/charts.py.
Pages are plain HTML (no JavaScript); who may see them is decided by `LOOM_RESULTS_PUBLIC` (staff only
unless it is set).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterable
from functools import wraps

from django.contrib.auth.views import redirect_to_login
from django.core.paginator import Paginator
from django.db.models import Count
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.safestring import mark_safe

from benchmarks import charts
from benchmarks.command import run_as_json
from benchmarks.compare import DEFAULT_FACTOR, Cell, compare, is_gated
from benchmarks.models import BenchRun
from benchmarks.recording import redacted_command_line, scrub_settings
from journal import conf

CSV_FIELDS = ("section", "scenario", "params", "throughput", "unit", "p50_ms", "p95_ms", "p99_ms", "max_ms",
              "count", "metrics")


def results_access(view: Callable) -> Callable:
    """Staff only, through Django auth (the admin's login page), because recorded runs name machines,
    commits and settings; open to anyone only when LOOM_RESULTS_PUBLIC is set (an explicit opt-in)."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs):
        if not conf.get("LOOM_RESULTS_PUBLIC"):
            user = request.user
            if not (user.is_authenticated and user.is_active and user.is_staff):
                return redirect_to_login(request.get_full_path(), reverse("admin:login"))
        return view(request, *args, **kwargs)

    return wrapper


def _shown(run: BenchRun) -> BenchRun:
    """The run as a page may show it (not saved): secrets redacted even in runs recorded before the
    allow-list (benchmarks/recording.py)."""
    run.settings = scrub_settings(run.settings or {})
    run.argv = redacted_command_line(run.argv)
    return run


def _sections(results: Iterable) -> list[dict]:
    """Results grouped by section, in recorded order, with the numeric metric columns of each."""
    grouped: dict[str, list] = {}
    for result in results:
        grouped.setdefault(result.section, []).append(result)
    sections = []
    for name, rows in grouped.items():
        extra = sorted({k for r in rows for k, v in (r.metrics or {}).items()
                        if isinstance(v, (int, float)) and not isinstance(v, bool)})
        cells = [Cell.from_result(r) for r in rows]
        sections.append({
            "name": name,
            "extra": extra,
            "rows": [{"result": r, "params": _params(r.params), "gated": is_gated(c), "once": measured_once(r),
                      "extras": [(r.metrics or {}).get(k) for k in extra]} for r, c in zip(rows, cells, strict=True)],
            # Safe: charts.py escapes every label and value it puts into the markup.
            "charts": [{"title": c.title, "svg": mark_safe(c.svg)}
                       for c in charts.section_charts(name, cells)],
        })
    return sections


def measured_once(result) -> bool:
    """A timed cell whose figure rests on one measurement (count 1: the growth section's recovery sweep at a
    size, say): no spread, no percentile worth the name; the page flags it (issue 28)."""
    return result.count == 1 and (result.throughput is not None or result.p50_ms is not None)


def _params(params: dict | None) -> str:
    return ", ".join(f"{k}={v}" for k, v in (params or {}).items())


@results_access
def run_list(request: HttpRequest) -> HttpResponse:
    # Explicit order: Meta.ordering is not applied to an aggregated (GROUP BY) query.
    runs = BenchRun.objects.annotate(cells=Count("results")).order_by("-started_at", "-id")
    command, vendor = request.GET.get("command", ""), request.GET.get("vendor", "")
    if "\x00" in command or "\x00" in vendor:
        # PostgreSQL refuses NUL in text: a filter with one can match nothing, and must not become a 500.
        return HttpResponseBadRequest("command and vendor filters cannot contain NUL characters",
                                      content_type="text/plain; charset=utf-8")
    if command:
        runs = runs.filter(command=command)
    if vendor:
        runs = runs.filter(db_vendor=vendor)
    page = Paginator(runs, 50).get_page(request.GET.get("page"))
    for run in page.object_list:
        _shown(run)  # the command line shown beside the command's name, secrets redacted
    return render(request, "benchmarks/run_list.html", {
        "page": page,
        "runs": page.object_list,
        "command": command,
        "vendor": vendor,
        "commands": BenchRun.objects.order_by("command").values_list("command", flat=True).distinct(),
        "vendors": BenchRun.objects.order_by("db_vendor").values_list("db_vendor", flat=True).distinct(),
    })


@results_access
def run_detail(request: HttpRequest, pk: int) -> HttpResponse:
    run = _shown(get_object_or_404(BenchRun, pk=pk))
    previous = (BenchRun.objects.filter(command=run.command, db_vendor=run.db_vendor, started_at__lt=run.started_at)
                .order_by("-started_at", "-id").first())
    return render(request, "benchmarks/run_detail.html", {
        "run": run,
        "sections": _sections(run.results.all()),
        "previous": previous,
        "duration_s": (run.finished_at - run.started_at).total_seconds() if run.finished_at else None,
        "options": json.dumps(run.settings.get("options", {}), indent=1, sort_keys=True),
        "skipped": run.settings.get("skipped", {}),
    })


def _factor(request: HttpRequest) -> float:
    try:
        factor = float(request.GET.get("threshold", DEFAULT_FACTOR))
    except ValueError:
        return DEFAULT_FACTOR
    return factor if factor > 1 else DEFAULT_FACTOR


def _pair(request: HttpRequest, base: int | None, new: int | None) -> tuple[BenchRun, BenchRun]:
    try:
        base = base if base is not None else int(request.GET["base"])
        new = new if new is not None else int(request.GET["new"])
    except (KeyError, ValueError):
        raise Http404("pick two runs: ?base=<run id>&new=<run id>") from None
    return get_object_or_404(BenchRun, pk=base), get_object_or_404(BenchRun, pk=new)


def _comparison(base: BenchRun, new: BenchRun, factor: float) -> list:
    return compare([Cell.from_result(r) for r in base.results.all()],
                   [Cell.from_result(r) for r in new.results.all()], factor)


@results_access
def compare_runs(request: HttpRequest, base: int | None = None, new: int | None = None) -> HttpResponse:
    if base is None and "base" in request.GET and "new" in request.GET:
        # The list page's form submits ?base=&new=; send it to the canonical, linkable address.
        base_run, new_run = _pair(request, None, None)
        url = reverse("benchmarks:compare", args=[base_run.pk, new_run.pk])
        query = f"?threshold={request.GET['threshold']}" if request.GET.get("threshold") else ""
        return redirect(url + query)
    base_run, new_run = _pair(request, base, new)
    _shown(base_run)
    _shown(new_run)
    factor = _factor(request)
    rows = _comparison(base_run, new_run, factor)
    counts = {status: sum(1 for r in rows if r.status == status)
              for status in ("regression", "improvement", "noise", "same", "added", "removed")}
    shared_only = request.GET.get("shared") == "1"  # hide the rows only one of the runs has
    sections: dict[str, list] = {}
    for row in rows:
        if shared_only and row.status in ("added", "removed"):
            continue
        sections.setdefault(row.cell.section, []).append(
            {"row": row, "params": _params(row.cell.params), "gated": is_gated(row.cell)})
    # Safe: charts.py escapes every label and value it puts into the markup.
    chart = charts.compare_chart(f"#{base_run.pk} → #{new_run.pk}: new ÷ base per section (geometric mean of "
                                 "its shared cells)", rows)
    return render(request, "benchmarks/compare.html", {
        "base": base_run, "new": new_run, "factor": factor, "sections": sections, "counts": counts,
        "shared_only": shared_only, "chart": mark_safe(chart) if chart else "",
    })


def _csv_response(filename: str) -> tuple[HttpResponse, csv.writer]:
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response, csv.writer(response)


@results_access
def run_csv(request: HttpRequest, pk: int) -> HttpResponse:
    """One row per cell; params and metrics as JSON so any command's cells fit the same columns."""
    run = get_object_or_404(BenchRun, pk=pk)
    response, writer = _csv_response(f"bench-run-{run.pk}.csv")
    writer.writerow(("run", "command", "db_vendor", "git_commit", *CSV_FIELDS))
    for r in run.results.all():
        writer.writerow((run.pk, run.command, run.db_vendor, run.git_commit, r.section, r.scenario,
                         json.dumps(r.params, sort_keys=True), *(_blank(getattr(r, f)) for f in CSV_FIELDS[3:-1]),
                         json.dumps(r.metrics, sort_keys=True)))
    return response


def _blank(value) -> object:
    return "" if value is None else value


@results_access
def run_json(request: HttpRequest, pk: int) -> HttpResponse:
    """The same document `bench_* --json` writes."""
    run = _shown(get_object_or_404(BenchRun, pk=pk))
    response = JsonResponse(run_as_json(run, run.results.all()), json_dumps_params={"indent": 2})
    response["Content-Disposition"] = f'inline; filename="bench-run-{run.pk}.json"'
    return response


@results_access
def compare_csv(request: HttpRequest, base: int, new: int) -> HttpResponse:
    base_run, new_run = _pair(request, base, new)
    factor = _factor(request)
    response, writer = _csv_response(f"bench-compare-{base_run.pk}-{new_run.pk}.csv")
    writer.writerow(("key", "section", "scenario", "params", "unit", "base_throughput", "new_throughput",
                     "throughput_ratio", "base_p50_ms", "new_p50_ms", "p50_ratio", "base_p99_ms", "new_p99_ms",
                     "p99_ratio", "status"))
    for row in _comparison(base_run, new_run, factor):
        b, n, c = row.base, row.new, row.cell
        writer.writerow((row.key, c.section, c.scenario, json.dumps(c.params, sort_keys=True), c.unit,
                         _blank(b and b.throughput), _blank(n and n.throughput), _blank(row.throughput_ratio),
                         _blank(b and b.p50_ms), _blank(n and n.p50_ms), _blank(row.p50_ratio),
                         _blank(b and b.p99_ms), _blank(n and n.p99_ms), _blank(row.p99_ratio), row.status))
    return response
