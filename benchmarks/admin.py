"""Admin of recorded runs: browsable, filterable, read-only (a recorded measurement is not edited).

The pages use the shared read-only base (journal/admin_base.py). One exception, on purpose: deleting a
run (with its results) stays possible for housekeeping, under Django's delete permissions of BenchRun
and BenchResult (the admin asks for both before it deletes a run); adding or changing one is not.
"""

from __future__ import annotations

from django.contrib import admin
from django.db.models import Count
from django.urls import reverse

from benchmarks.models import BenchResult, BenchRun
from journal.admin_base import ReadOnlyAdmin, ReadOnlyInline


class DeletableForHousekeeping(ReadOnlyAdmin):
    """Read-only, except that deleting follows Django's delete permission (old runs are cleared by hand)."""

    def has_delete_permission(self, request, obj=None) -> bool:
        return admin.ModelAdmin.has_delete_permission(self, request, obj)


class BenchResultInline(ReadOnlyInline):
    model = BenchResult
    fields = ("section", "scenario", "params", "throughput", "unit", "p50_ms", "p95_ms", "p99_ms", "max_ms",
              "count", "metrics")
    readonly_fields = fields
    show_change_link = True


@admin.register(BenchRun)
class BenchRunAdmin(DeletableForHousekeeping):
    list_display = ("id", "started_at", "command", "status", "cells", "short_commit", "git_dirty", "db_vendor",
                    "db_version", "machine", "cpu_count")
    list_display_links = ("id", "started_at")
    list_filter = ("command", "status", "db_vendor", "git_dirty", "machine", "started_at")
    search_fields = ("argv", "git_commit", "machine", "db_version", "error")
    date_hierarchy = "started_at"
    inlines = (BenchResultInline,)
    readonly_fields = [f.name for f in BenchRun._meta.fields]

    def view_on_site(self, obj: BenchRun) -> str:
        return reverse("benchmarks:run_detail", args=[obj.pk])

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(cell_count=Count("results"))

    @admin.display(description="cells", ordering="cell_count")
    def cells(self, obj: BenchRun) -> int:
        return obj.cell_count

    @admin.display(description="commit", ordering="git_commit")
    def short_commit(self, obj: BenchRun) -> str:
        return obj.git_commit[:10]


@admin.register(BenchResult)
class BenchResultAdmin(DeletableForHousekeeping):
    list_display = ("id", "run", "section", "scenario", "params", "throughput", "unit", "p50_ms", "p99_ms", "count")
    list_filter = ("section", "scenario", "run__command", "run__db_vendor")
    search_fields = ("section", "scenario")
    list_select_related = ("run",)
    readonly_fields = [f.name for f in BenchResult._meta.fields]

    def view_on_site(self, obj: BenchResult) -> str:
        return reverse("benchmarks:run_detail", args=[obj.run_id])
