"""Result pages: the list of runs and one run's tables."""

from __future__ import annotations

from django.shortcuts import get_object_or_404, render

from benchmarks.models import BenchRun


def run_list(request):
    runs = BenchRun.objects.all()[:200]
    return render(request, "benchmarks/run_list.html", {"runs": runs})


def run_detail(request, pk: int):
    run = get_object_or_404(BenchRun, pk=pk)
    return render(request, "benchmarks/run_detail.html", {"run": run, "results": run.results.all()})
