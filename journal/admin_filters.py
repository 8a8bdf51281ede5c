"""The executions list's flow, queue and schedule filters (journal/admin.py lists them).

A flow is a flow's name or a Django task's dotted name (a `loom.task` execution, journal/task_names.py).

An execution's queue is its entry in the queues app (queues.models.QueueEntry, joined by execution
id: no foreign key between the apps); its schedule is in its id (`sched:<name>:<tick>`, leases/schedules.py).
Each filter offers nothing when its app is not installed, so the journal's admin never needs them.
"""

from __future__ import annotations

from django.apps import apps
from django.contrib import admin


class FlowFilter(admin.SimpleListFilter):
    title = "flow"
    parameter_name = "flow"  # the parameter of the field filter it replaces: old links keep working

    def lookups(self, request, model_admin):
        from journal.models import Execution
        from journal.task_names import TASK_FLOW

        flows = list(Execution.objects.order_by("flow").values_list("flow", flat=True).distinct()[:200])
        tasks = []
        if TASK_FLOW in flows:
            tasks = [name for name in Execution.objects.filter(flow=TASK_FLOW).order_by()
                     .values_list("input__task", flat=True).distinct()[:200] if isinstance(name, str)]
        return [(name, name) for name in sorted({*flows, *tasks})]

    def queryset(self, request, queryset):
        from journal.task_names import flow_q

        value = self.value()
        return queryset.filter(flow_q(value)) if value else queryset


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
