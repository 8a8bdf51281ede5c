"""django-q2's task admin, re-registered so that acting needs a permission (issue 12).

django-q2 registers Success and Failure with a "Resubmit selected tasks to queue" action that declares no
permission, so any staff user who may view the list can enqueue tasks (a new OrmQ row, run by every
worker). Here the same pages are registered again with the action gated on the model's change permission
(and, on failures, the delete permission too: resubmitting a failure deletes it), and their list pages
answer a hostile filter (`?group=%00`) with "?e=1" like every Loom list page (journal/admin_base.py). The
leases app imports this module from its admin, since it runs django-q2's cluster (`loom_worker`).
"""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest
from django_q import admin as q_admin  # registers django-q2's pages first, whatever the INSTALLED_APPS order
from django_q.models import Failure, Success

from journal.admin_base import SafeChangeList


@admin.action(description="Resubmit selected tasks to queue", permissions=["resubmit"])
def resubmit_task(model_admin, request, queryset) -> None:
    q_admin.resubmit_task(model_admin, request, queryset)


class SuccessAdmin(SafeChangeList, q_admin.TaskAdmin):
    actions = [resubmit_task]

    def has_resubmit_permission(self, request: HttpRequest) -> bool:
        return self.has_change_permission(request)


class FailureAdmin(SafeChangeList, q_admin.FailAdmin):
    actions = [resubmit_task]

    def has_resubmit_permission(self, request: HttpRequest) -> bool:
        return self.has_change_permission(request) and self.has_delete_permission(request)


for model, model_admin in ((Success, SuccessAdmin), (Failure, FailureAdmin)):
    if admin.site.is_registered(model):
        admin.site.unregister(model)
    admin.site.register(model, model_admin)
