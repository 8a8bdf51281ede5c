"""The executions list's queue and schedule filters (journal/admin.py lists them).

An execution's queue is its entry in the queues app (queues.models.QueueEntry, joined by execution
id: no foreign key between the apps); its schedule is in its id (`sched:<name>:<tick>`, leases/schedules.py).
Each filter offers nothing when its app is not installed, so the journal's admin never needs them.
"""

from __future__ import annotations

from django.apps import apps
from django.contrib import admin


class QueueFilter(admin.SimpleListFilter):
    title = "queue"
    parameter_name = "queue"

    def lookups(self, request, model_admin):
        if not apps.is_installed("queues"):
            return []
        from queues.models import Queue

        return [(name, name) for name in Queue.objects.order_by("name").values_list("name", flat=True)[:200]]

    def queryset(self, request, queryset):
        value = self.value()
        if not value or not apps.is_installed("queues"):
            return queryset
        from queues.models import QueueEntry

        return queryset.filter(pk__in=QueueEntry.objects.filter(queue_id=value).values("execution_id"))


class ScheduleFilter(admin.SimpleListFilter):
    title = "schedule"
    parameter_name = "schedule"

    def lookups(self, request, model_admin):
        if not apps.is_installed("leases"):
            return []
        from leases.models import Schedule

        return [(name, name) for name in Schedule.objects.order_by("name").values_list("name", flat=True)[:200]]

    def queryset(self, request, queryset):
        value = self.value()
        if not value:
            return queryset
        from leases.schedules import ID_PREFIX

        return queryset.filter(id__startswith=f"{ID_PREFIX}{value}:")
