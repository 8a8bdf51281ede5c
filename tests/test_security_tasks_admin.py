"""django-q2's task pages in the admin (issue 12 review): "Resubmit selected tasks" enqueues a task that
every worker runs, so it needs a permission (leases/admin_q.py); view-only staff cannot enqueue.
"""

from __future__ import annotations

import uuid

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse
from django.utils import timezone
from django_q.models import Failure, OrmQ, Success, Task

pytestmark = pytest.mark.django_db


def staff(client, app_label: str, *codenames: str) -> User:
    user = User.objects.create_user(f"staff-{uuid.uuid4().hex[:8]}", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label=app_label, codename__in=codenames))
    client.force_login(user)
    return user


def finished_task(success: bool) -> Task:
    now = timezone.now()
    return Task.objects.create(id=uuid.uuid4().hex, name=f"task-{uuid.uuid4().hex[:6]}", func="math.floor",
                               args=(1.5,), kwargs={}, started=now, stopped=now, success=success, result=1)


def resubmit(client, model: type[Task], task: Task):
    url = reverse(f"admin:django_q_{model._meta.model_name}_changelist")
    return client.post(url, {"action": "resubmit_task", "_selected_action": [task.pk], "index": 0})


@pytest.mark.parametrize("model", [Success, Failure])
def test_a_view_only_staff_user_cannot_resubmit_tasks(client, model):
    """Before: 302 and a new OrmQ row (a task every worker runs). Now the action is not offered and a POST
    of it enqueues nothing; the failure stays."""
    task = finished_task(success=model is Success)
    staff(client, "django_q", f"view_{model._meta.model_name}")
    url = reverse(f"admin:django_q_{model._meta.model_name}_changelist")
    page = client.get(url)
    assert page.status_code == 200 and task.name in page.content.decode()
    assert 'value="resubmit_task"' not in page.content.decode()
    queued = OrmQ.objects.count()
    resubmit(client, model, task)
    assert OrmQ.objects.count() == queued
    assert Task.objects.filter(pk=task.pk).exists()


def test_resubmitting_needs_change_and_for_a_failure_delete(client):
    """Change on successes; change and delete on failures (resubmitting a failure deletes it)."""
    done, failed = finished_task(success=True), finished_task(success=False)
    staff(client, "django_q", "view_success", "change_success", "view_failure", "change_failure")
    queued = OrmQ.objects.count()
    resubmit(client, Failure, failed)
    assert OrmQ.objects.count() == queued  # change alone does not resubmit a failure
    resubmit(client, Success, done)
    assert OrmQ.objects.count() == queued + 1
    staff(client, "django_q", "view_failure", "change_failure", "delete_failure")
    resubmit(client, Failure, failed)
    assert OrmQ.objects.count() == queued + 2 and not Task.objects.filter(pk=failed.pk).exists()


@pytest.mark.parametrize("model", [Success, Failure])
@pytest.mark.parametrize("query", ["group=%00", "q=a%00b", "started__year=99999999999"])
def test_a_hostile_filter_on_the_task_pages_is_refused_without_the_sites_middleware(admin_client, settings, model,
                                                                                    query):
    """Like every Loom list page: "?e=1", not a 500 (PostgreSQL refuses NUL in text), in a host project too."""
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if m != "loomsite.middleware.HostileQueryMiddleware"]
    finished_task(success=model is Success)
    url = reverse(f"admin:django_q_{model._meta.model_name}_changelist")
    response = admin_client.get(f"{url}?{query}")
    assert response.status_code == 302 and response["Location"] == f"{url}?e=1"
