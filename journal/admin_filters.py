"""The executions list's flow filter (journal/admin.py lists it).

A flow is a flow's name or a Django task's dotted name (a `loom.task` execution, journal/task_names.py).
The queue and schedule filters are their apps' (queues/admin.py, leases/admin_schedules.py), added
through `journal.admin_base.add_execution_filter`, so the journal's admin names no app above it.
"""

from __future__ import annotations

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
