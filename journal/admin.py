"""The journal in the admin: executions with their timeline, and the log, read-only.

The log is append-only, so the admin never adds, changes or deletes events, fences or snapshots;
execution headers are written by the runtime only. The two things an operator may do to an
execution, resume and cancel, are actions that call journal.flows (they write events through the
runtime's fenced write path, like any other run).
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.http import HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import path, reverse

from journal.models import Event, Execution, Fence, Snapshot


class ReadOnlyAdmin(admin.ModelAdmin):
    """Views only: no add, change or delete."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


def _act(request, execution_ids, verb: str) -> None:
    from journal.flows import cancel, resume

    call = resume if verb == "resume" else cancel
    for eid in execution_ids:
        try:
            out = call(eid)
        except Exception as exc:  # shown to the operator, never a 500
            messages.error(request, f"{verb} {eid}: {type(exc).__name__}: {exc}")
        else:
            messages.success(request, f"{verb} {eid}: {out.status}" + (f" ({out.error})" if out.error else ""))


@admin.register(Execution)
class ExecutionAdmin(ReadOnlyAdmin):
    list_display = ("id", "flow", "status", "created_at", "finished_at", "recoveries")
    list_filter = ("status", "flow")
    search_fields = ("id", "flow")
    readonly_fields = ("id", "flow", "status", "input", "result", "error", "recoveries", "created_at",
                       "updated_at", "finished_at", "lease_panel")
    actions = ("resume_executions", "cancel_executions")

    @admin.display(description="lease")
    def lease_panel(self, execution) -> str:
        from leases.admin import lease_summary  # the leases app's read-only panel

        return lease_summary(execution.pk)
    change_form_template = "journal/execution_change_form.html"
    list_per_page = 50
    show_full_result_count = False  # no count(*) over a large table on every page

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_view_permission(self, request, obj=None) -> bool:
        return request.user.is_active and request.user.is_staff

    @admin.action(description="Resume selected executions (new fence, replay, continue)", permissions=["operate"])
    def resume_executions(self, request, queryset):
        _act(request, list(queryset.values_list("id", flat=True)), "resume")

    @admin.action(description="Cancel selected executions (recorded as EXECUTION_CANCELLED)", permissions=["operate"])
    def cancel_executions(self, request, queryset):
        _act(request, list(queryset.values_list("id", flat=True)), "cancel")

    def has_operate_permission(self, request) -> bool:
        """Resume and cancel: staff with the change permission (the page itself stays read-only)."""
        return request.user.is_superuser or request.user.has_perm("journal.change_execution")

    def get_urls(self):
        urls = super().get_urls()
        extra = [
            path("<path:object_id>/resume/", self.admin_site.admin_view(self._one("resume")),
                 name="journal_execution_resume"),
            path("<path:object_id>/cancel/", self.admin_site.admin_view(self._one("cancel")),
                 name="journal_execution_cancel"),
        ]
        return extra + urls

    def _one(self, verb: str):
        def view(request, object_id):
            execution = get_object_or_404(Execution, pk=object_id)
            url = reverse("admin:journal_execution_change", args=[execution.pk])
            if request.method != "POST":
                return HttpResponseRedirect(url)
            if not self.has_operate_permission(request):
                messages.error(request, f"you may not {verb} executions")
            else:
                _act(request, [execution.pk], verb)
            return HttpResponseRedirect(url)

        return view

    def change_view(self, request, object_id, form_url="", extra_context=None):
        from journal.flows import describe
        from journal.flows.errors import UnknownExecution

        extra_context = dict(extra_context or {})
        try:
            view = describe(object_id)
        except UnknownExecution:
            view = None
        extra_context["execution_view"] = view
        extra_context["may_act"] = self.has_operate_permission(request)
        return super().change_view(request, object_id, form_url, extra_context)


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ("stream_id", "seq", "type", "recorded_at")
    list_filter = ("type",)
    search_fields = ("stream_id",)
    readonly_fields = ("id", "stream_id", "seq", "type", "payload", "recorded_at")
    show_full_result_count = False


@admin.register(Fence)
class FenceAdmin(ReadOnlyAdmin):
    list_display = ("stream_id", "token", "created_at")
    search_fields = ("stream_id",)
    readonly_fields = ("stream_id", "token", "created_at")


@admin.register(Snapshot)
class SnapshotAdmin(ReadOnlyAdmin):
    list_display = ("stream_id", "seq", "created_at")
    search_fields = ("stream_id",)
    readonly_fields = ("stream_id", "seq", "state", "created_at")
