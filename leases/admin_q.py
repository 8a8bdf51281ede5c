"""django-q2's admin pages, re-registered so that no permission short of superuser runs code (issues 12, 25).

- **Successful and failed tasks.** django-q2's "Resubmit selected tasks to queue" declares no permission,
  so any staff user who may view the list could enqueue tasks (a new OrmQ row, run by every worker); here
  it needs the model's change permission (and, on failures, the delete permission too: resubmitting a
  failure deletes it). Their `args`, `kwargs` and `result` columns are unsigned pickles that the ORM
  would unpickle as soon as a row is fetched (a forged `django_q_task` row ran code in the web process
  when view-only staff opened "Successful tasks"): these pages never let the ORM decode them. The columns
  are deferred, read as text and decoded by leases/safe_pickle.py, which builds plain values only; a row
  holding anything else shows "(not shown: ...)" and is not resubmitted.
- **Scheduled tasks.** A django-q2 schedule names any importable callable (`os.system`) and its
  arguments, and the worker calls it: adding or changing one is code execution in the worker, which holds
  `SECRET_KEY`, `LOOM_KEYS` and the database password. Only superusers add, change or delete them; other
  staff with the view permission see them read-only.
- Their list pages answer a hostile filter (`?group=%00`) with "?e=1" like every Loom list page
  (journal/admin_base.py).

The leases app imports this module from its admin, since it runs django-q2's cluster (`loom_worker`).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import TextField
from django.db.models.functions import Cast
from django.http import HttpRequest
from django_q import admin as q_admin  # registers django-q2's pages first, whatever the INSTALLED_APPS order
from django_q.models import Failure, Schedule, Success, Task
from django_q.tasks import async_task

from journal.admin_base import SafeChangeList
from leases.safe_pickle import UnsafePickle, plain_value

PICKLED = ("args", "kwargs", "result")
"""The picklefield columns of django_q_task: never decoded by the ORM on these pages."""


def _decoded(task: Task, column: str) -> Any:
    """The plain value of a pickled column (read as text by the page's queryset); UnsafePickle otherwise."""
    return plain_value(getattr(task, f"{column}_text"), compressed=Task._meta.get_field(column).compress)


def _shown(task: Task, column: str) -> str:
    try:
        value = _decoded(task, column)
    except UnsafePickle as exc:
        return f"(not shown: {exc})"
    return "-" if value is None else repr(value)


@admin.action(description="Resubmit selected tasks to queue", permissions=["resubmit"])
def resubmit_task(model_admin, request, queryset) -> None:
    """django-q2's resubmit, with arguments decoded as plain values only; a task whose arguments are not
    is left alone and named."""
    refused = []
    for task in queryset:
        try:
            args, kwargs = _decoded(task, "args") or (), _decoded(task, "kwargs") or {}
        except UnsafePickle:
            refused.append(task.name or task.pk)
            continue
        if not isinstance(args, (list, tuple)) or not isinstance(kwargs, dict):
            refused.append(task.name or task.pk)
            continue
        async_task(task.func, *args, hook=task.hook, group=task.group, cluster=task.cluster, **kwargs)
        if isinstance(model_admin, FailureAdmin):
            task.delete()
    if refused:
        model_admin.message_user(request, f"not resubmitted (their arguments are not plain values): "
                                 f"{', '.join(map(str, refused))}", messages.WARNING)


class _TaskPages(SafeChangeList):
    """What Success and Failure pages share: pickled columns deferred, read as text, decoded safely."""

    actions = [resubmit_task]
    withheld_lookups = PICKLED

    def get_queryset(self, request: HttpRequest):
        texts = {f"{column}_text": Cast(column, output_field=TextField()) for column in PICKLED}
        return super().get_queryset(request).defer(*PICKLED).annotate(**texts)

    def get_fields(self, request: HttpRequest, obj=None):
        plain = [f.name for f in Task._meta.fields if f.name not in PICKLED]
        return [*plain, "arguments", "keyword_arguments", "task_result"]

    def get_readonly_fields(self, request: HttpRequest, obj=None):
        return self.get_fields(request, obj)

    @admin.display(description="arguments")
    def arguments(self, task: Task) -> str:
        return _shown(task, "args")

    @admin.display(description="keyword arguments")
    def keyword_arguments(self, task: Task) -> str:
        return _shown(task, "kwargs")

    @admin.display(description="result")
    def task_result(self, task: Task) -> str:
        return _shown(task, "result")


class SuccessAdmin(_TaskPages, q_admin.TaskAdmin):
    def has_resubmit_permission(self, request: HttpRequest) -> bool:
        return self.has_change_permission(request)


class FailureAdmin(_TaskPages, q_admin.FailAdmin):
    list_display = ("name", "group", "func", "cluster", "started", "stopped", "short_result")

    @admin.display(description="Short result")
    def short_result(self, task: Task) -> str:
        text = _shown(task, "result")
        return text if len(text) <= 100 else text[:99] + "…"

    def has_resubmit_permission(self, request: HttpRequest) -> bool:
        return self.has_change_permission(request) and self.has_delete_permission(request)


class ScheduleAdmin(SafeChangeList, q_admin.ScheduleAdmin):
    """Read-only but for superusers: a schedule's func is any callable the worker imports and calls."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return request.user.is_active and request.user.is_superuser

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return request.user.is_active and request.user.is_superuser

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return request.user.is_active and request.user.is_superuser


for model, model_admin in ((Success, SuccessAdmin), (Failure, FailureAdmin), (Schedule, ScheduleAdmin)):
    if admin.site.is_registered(model):
        admin.site.unregister(model)
    admin.site.register(model, model_admin)
