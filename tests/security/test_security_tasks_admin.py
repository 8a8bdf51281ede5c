"""django-q2's task pages in the admin (issue 12 review): "Resubmit selected tasks" enqueues a task that
every worker runs, so it needs a permission (leases/admin_q.py); view-only staff cannot enqueue.
"""

from __future__ import annotations

import base64
import contextlib
import pickle
import uuid
import zlib

import pytest
from django.contrib.auth.models import Permission, User
from django.db.models import TextField, Value
from django.urls import reverse
from django.utils import timezone
from django_q.models import Failure, OrmQ, Success, Task
from hypothesis import given, settings
from hypothesis import strategies as st

from leases.safe_pickle import UnsafePickle, plain_value

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


# -- forged pickles in django_q_task are never decoded (issue 25) -------------------------------------------

RAN: list[str] = []


def mark(what: str) -> str:
    """What a forged pickle calls when it is loaded (an attacker's would call os.system)."""
    RAN.append(what)
    return what


class Forged:
    """Pickles as a call of `mark`: unpickling it runs code."""

    def __init__(self, what: str):
        self.what = what

    def __reduce__(self):
        return mark, (self.what,)


def forged_task(success: bool) -> Task:
    """A django_q_task row as a database writer could forge it: each pickled column's text (base64 of a
    pickle, as django-picklefield stores it) written as is, not through the field."""
    task = finished_task(success)
    forged = {column: Value(base64.b64encode(pickle.dumps(Forged(column))).decode(), output_field=TextField())
              for column in ("args", "kwargs", "result")}
    Task.objects.filter(pk=task.pk).update(**forged)
    return task


@pytest.mark.parametrize("model", [Success, Failure])
def test_opening_a_forged_task_row_runs_nothing(client, model):
    """Before: the list page (and the detail page) unpickled args, kwargs and result: RAN was
    ["args", "kwargs", "result"] (code run in the web process for a view-only user). Now the columns are
    decoded as plain values only, and the forged ones are shown as refused."""
    task = forged_task(success=model is Success)
    staff(client, "django_q", f"view_{model._meta.model_name}")
    name = model._meta.model_name
    listing = client.get(reverse(f"admin:django_q_{name}_changelist"))
    assert listing.status_code == 200 and task.name in listing.content.decode()
    detail = client.get(reverse(f"admin:django_q_{name}_change", args=[task.pk]))
    assert detail.status_code == 200
    shown = "not shown: the pickle names tests.security.test_security_tasks_admin.mark"
    assert detail.content.decode().count(shown) == 3
    assert RAN == []


def test_plain_arguments_and_results_are_still_shown(client):
    task = finished_task(success=True)
    staff(client, "django_q", "view_success")
    page = client.get(reverse("admin:django_q_success_change", args=[task.pk])).content.decode()
    assert "(1.5,)" in page and "{}" in page


def test_a_forged_task_is_not_resubmitted_and_runs_nothing(client):
    task = forged_task(success=True)
    staff(client, "django_q", "view_success", "change_success")
    queued = OrmQ.objects.count()
    response = resubmit(client, Success, task)
    assert response.status_code == 302
    assert OrmQ.objects.count() == queued and RAN == []
    page = client.get(response["Location"]).content.decode()
    assert "Not resubmitted (their arguments are not plain values)" in page and task.name in page


# -- django-q2 schedules are code execution: superusers only (issue 25) --------------------------------------

def q_schedule_form(func: str = "os.system") -> dict:
    return {"name": "evil", "func": func, "hook": "", "args": "'touch /tmp/pwned'", "kwargs": "",
            "schedule_type": "O", "minutes": "", "repeats": "-1", "next_run_0": "2030-01-01",
            "next_run_1": "00:00:00", "cron": "", "cluster": "", "intended_date_kwarg": ""}


def test_a_staff_user_holding_add_schedule_cannot_schedule_a_callable(client):
    """Before: 302 and a Schedule row calling os.system in the worker. Now the add page is refused (403),
    nothing is written, and the list is read-only."""
    from django_q.models import Schedule

    staff(client, "django_q", "add_schedule", "change_schedule", "delete_schedule", "view_schedule")
    assert client.get(reverse("admin:django_q_schedule_add")).status_code == 403
    assert client.post(reverse("admin:django_q_schedule_add"), q_schedule_form()).status_code == 403
    assert not Schedule.objects.exists()
    row = Schedule.objects.create(name="nightly", func="math.floor", args="1.5")
    page = client.get(reverse("admin:django_q_schedule_change", args=[row.pk])).content.decode()
    assert 'name="_save"' not in page
    assert client.post(reverse("admin:django_q_schedule_change", args=[row.pk]),
                       q_schedule_form()).status_code == 403
    row.refresh_from_db()
    assert row.func == "math.floor"
    listing = client.get(reverse("admin:django_q_schedule_changelist")).content.decode()
    assert 'value="delete_selected"' not in listing


def test_a_superuser_still_manages_django_q_schedules(admin_client):
    from django_q.models import Schedule

    response = admin_client.post(reverse("admin:django_q_schedule_add"), q_schedule_form("math.floor"))
    assert response.status_code == 302, response.content.decode()[:2000]
    assert Schedule.objects.get().func == "math.floor"


plain_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
                            | st.binary(), lambda inner: st.lists(inner) | st.tuples(inner, inner)
                            | st.dictionaries(st.text(), inner), max_leaves=20)


@given(plain_values, st.booleans())
@settings(max_examples=200, deadline=None)
def test_plain_values_decode_as_they_were_pickled(value, compressed):
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    text = base64.b64encode(zlib.compress(data) if compressed else data).decode()
    assert plain_value(text, compressed=compressed) == value


@given(st.one_of(st.text(max_size=200), st.binary(max_size=200).map(lambda b: base64.b64encode(b).decode())))
@settings(max_examples=300, deadline=None)
def test_any_column_text_is_a_plain_value_or_our_named_refusal(text):
    """Never another exception: a value, or UnsafePickle."""
    with contextlib.suppress(UnsafePickle):
        plain_value(text)


def test_a_pickle_naming_a_global_is_refused_before_its_module_is_imported():
    import sys

    forged = b"\x80\x04cexits_nowhere_b1\nrun\n)R."  # GLOBAL exits_nowhere_b1.run, called with ()
    with pytest.raises(UnsafePickle, match=r"exits_nowhere_b1\.run"):
        plain_value(base64.b64encode(forged).decode())
    assert "exits_nowhere_b1" not in sys.modules
