"""Admin: cron schedules (leases/schedules.py). A schedule made here is validated by
leases.schedules.define (the cron by cronsim, the flow registered, the input by the flow, the queue
declared) and written through the lease store, never by the ORM's save(); the workers tick it from
its row. The list shows each schedule's time zone, next and last tick (in UTC, and the next one in
the schedule's zone too) and its catch-up policy, and links to the executions it started (the
executions list filtered by schedule)."""

from __future__ import annotations

from django import forms
from django.contrib import admin
from django.contrib.admin.utils import quote
from django.urls import reverse
from django.utils.html import format_html

from journal.admin_base import RefuseUnstorableFilters, add_execution_filter
from journal.flows.errors import FlowError, UnknownFlow
from journal.flows.registry import exposed
from journal.timestamps import stamp
from leases import schedules as sc
from leases.models import Schedule


class ScheduleForm(forms.ModelForm):
    """The admin's form: every refusal of leases.schedules.validate becomes a form error (nothing written)."""

    class Meta:
        model = Schedule
        fields = ("name", "cron", "timezone", "flow", "input", "catch_up", "queue", "enabled")

    def clean(self):
        data = super().clean()
        if self.errors:
            return data
        name = self.instance.name if self.instance and self.instance.pk else data.get("name")
        flow = data.get("flow") or ""
        if not exposed(flow):
            # An internal flow (loom.task runs any task by path) is refused as an unknown name would be: a
            # staff user who may add schedules is not thereby allowed to run code (docs/security.md).
            raise forms.ValidationError(f"UnknownFlow: {UnknownFlow(flow)}")
        try:
            self.spec = sc.validate(name, data.get("cron"), data.get("flow") or "", data.get("input"),
                                    data.get("catch_up"), data.get("queue") or "", data.get("enabled", True),
                                    data.get("timezone"))
        except FlowError as exc:  # InvalidSchedule, UnknownFlow, InvalidInput: our errors, named
            raise forms.ValidationError(f"{type(exc).__name__}: {exc}") from None
        return data

    def validate_unique(self):
        """An existing name is updated by define(), as in code (the add page says so)."""


@admin.register(Schedule)
class ScheduleAdmin(RefuseUnstorableFilters, admin.ModelAdmin):
    form = ScheduleForm
    list_display = ("name", "cron", "timezone", "flow", "catch_up", "queue_name", "enabled", "next_tick",
                    "last_tick", "last_execution", "source")
    list_filter = ("enabled", "catch_up", "source", "timezone")
    search_fields = ("name", "flow")
    actions = None

    def get_readonly_fields(self, request, obj=None):
        shown = ("source", "next_tick", "last_tick", "last_execution", "executions")
        return ("name", *shown) if obj is not None else ()

    def get_fields(self, request, obj=None):
        fields = ["name", "cron", "timezone", "flow", "input", "catch_up", "queue", "enabled"]
        if obj is not None:
            fields += ["source", "next_tick", "last_tick", "last_execution", "executions"]
        return fields

    @admin.display(description="queue")
    def queue_name(self, schedule) -> str:
        return schedule.queue or "-"

    @admin.display(description="next tick", ordering="next_tick_at")
    def next_tick(self, schedule) -> str:
        """In UTC (the instant every worker compares), then in the schedule's zone when it is another:
        what the cron's fields mean, daylight saving applied."""
        text = stamp(schedule.next_tick_at)
        if schedule.timezone != "UTC" and schedule.next_tick_at is not None:
            try:
                local = schedule.next_tick_at.astimezone(sc.zone(schedule.timezone))
                text += f" ({local:%Y-%m-%d %H:%M:%S %Z} {schedule.timezone})"
            except (LookupError, ValueError):  # a zone this host's tz database lacks: UTC alone
                pass
        return text if schedule.enabled else f"(disabled) {text}"

    @admin.display(description="last tick", ordering="last_tick_at")
    def last_tick(self, schedule) -> str:
        return stamp(schedule.last_tick_at) or "-"

    @admin.display(description="last execution")
    def last_execution(self, schedule) -> str:
        if not schedule.last_execution_id:
            return "-"
        url = reverse("admin:journal_execution_change", args=[quote(schedule.last_execution_id)])
        return format_html('<a href="{}">{}</a>', url, schedule.last_execution_id)

    @admin.display(description="executions")
    def executions(self, schedule) -> str:
        url = reverse("admin:journal_execution_changelist")
        return format_html('<a href="{}?schedule={}">executions started by {}</a>', url, schedule.name, schedule.name)

    def save_model(self, request, obj, form, change):
        spec = form.spec
        sc.define(spec.name, spec.cron, spec.flow, spec.input, spec.catch_up, spec.queue, spec.enabled, spec.timezone,
                  source="admin")


class ScheduleFilter(admin.SimpleListFilter):
    """The executions list's schedule filter: a tick's schedule is in its execution id
    (`sched:<name>:<tick>`, leases/schedules.py)."""

    title = "schedule"
    parameter_name = "schedule"

    def lookups(self, request, model_admin):
        return [(name, name) for name in Schedule.objects.order_by("name").values_list("name", flat=True)[:200]]

    def queryset(self, request, queryset):
        value = self.value()
        if not value:
            return queryset
        return queryset.filter(id__startswith=f"{sc.ID_PREFIX}{value}:")


add_execution_filter("schedule", ScheduleFilter, place=50)
