"""The admin of the apps a host project embeds, without loomsite's middleware (issue 12 review):

- the subscription and checkpoint pages cannot be saved, by anyone: the all-read-only form would rewrite
  the row from a stale read and could move a watermark back; their actions still run on their own
  permissions;
- every list page of projections, leases and benchmarks answers a hostile filter (NUL) with the admin's
  "?e=1" redirect, not a 500, even where loomsite's HostileQueryMiddleware is not installed.
"""

from __future__ import annotations

import uuid

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission, User
from django.db import models
from django.urls import reverse

from projections.models import Checkpoint, Subscription

pytestmark = pytest.mark.django_db

HOSTILE_MIDDLEWARE = "loomsite.middleware.HostileQueryMiddleware"


def staff(client, app_label: str, *codenames: str) -> User:
    user = User.objects.create_user(f"staff-{uuid.uuid4().hex[:8]}", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label=app_label, codename__in=codenames))
    client.force_login(user)
    return user


# --- subscriptions and checkpoints are never saved from a form ------------------------------------------


def test_subscription_and_checkpoint_forms_cannot_be_saved_even_by_a_superuser(admin_client):
    """Saving rewrote the whole row from the form's read; now the page is read-only (403 on POST) and the
    watermark is untouched."""
    sub = Subscription.objects.create(consumer="c", stream="s", at=7, tip=7)
    point = Checkpoint.objects.create(consumer="c", position=9)
    for obj, data in ((sub, {"consumer": "c", "stream": "s", "at": 3}), (point, {"position": 1})):
        url = reverse(f"admin:projections_{obj._meta.model_name}_change", args=[obj.pk])
        page = admin_client.get(url)
        assert page.status_code == 200 and 'name="_save"' not in page.content.decode()
        assert admin_client.post(url, data).status_code == 403
    sub.refresh_from_db()
    point.refresh_from_db()
    assert (sub.at, point.position) == (7, 9)


def test_subscription_actions_still_run_on_their_own_permissions(client):
    """has_change_permission is False for everyone; unblock needs only view + unblock_subscription."""
    Subscription.objects.create(consumer="c", stream="s", at=1, tip=3, blocked=True, error="boom")
    staff(client, "projections", "view_subscription", "unblock_subscription")
    url = reverse("admin:projections_subscription_changelist")
    assert 'value="unblock"' in client.get(url).content.decode()
    client.post(url, {"action": "unblock", "_selected_action": list(Subscription.objects.values_list("pk", flat=True))})
    assert not Subscription.objects.get(stream="s").blocked


# --- hostile filters without loomsite's middleware ----------------------------------------------------------


def embedded_admins() -> list[tuple[str, str]]:
    """(changelist URL name, hostile query) for every ModelAdmin of projections, leases and benchmarks."""
    cases = []
    for model, model_admin in admin.site._registry.items():
        if model._meta.app_label not in {"projections", "leases", "benchmarks"}:
            continue
        name = f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist"
        text = next(f.name for f in model._meta.fields if isinstance(f, (models.CharField, models.TextField))
                    or (f.is_relation and isinstance(f.target_field, models.CharField)))  # a lease: owner
        cases.append((name, f"{text}=%00"))
        if model_admin.search_fields:
            cases.append((name, "q=a%00b"))
    return sorted(cases)


def test_every_embedded_admin_is_covered():
    names = {name for name, _ in embedded_admins()}
    assert {"admin:projections_subscription_changelist", "admin:projections_checkpoint_changelist",
            "admin:leases_lease_changelist", "admin:leases_worker_changelist",
            "admin:leases_recoveryview_changelist", "admin:benchmarks_benchrun_changelist",
            "admin:benchmarks_benchresult_changelist"} <= names


@pytest.mark.parametrize(("name", "query"), embedded_admins())
def test_a_nul_in_an_admin_filter_is_refused_without_the_sites_middleware(admin_client, settings, name, query):
    """A host project has no HostileQueryMiddleware: the page itself answers with "?e=1" (PostgreSQL refuses
    NUL in text, which was a 500)."""
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if m != HOSTILE_MIDDLEWARE]
    url = reverse(name)
    response = admin_client.get(f"{url}?{query}")
    assert response.status_code == 302, response.status_code
    assert response["Location"] == f"{url}?e=1"
    assert admin_client.get(response["Location"]).status_code == 200


# --- no filter on a secret column (issue 25) -----------------------------------------------------------------

# Text and JSON columns of Loom's admin pages that a viewer is shown whole anyway, so a filter on them tells
# nothing more. Every other one must be in its admin's withheld_lookups.
SHOWN_WHOLE = {
    ("leases.Schedule", "input"), ("projections.Subscription", "error"), ("benchmarks.BenchRun", "argv"),
    ("benchmarks.BenchRun", "error"), ("benchmarks.BenchRun", "settings"),  # stored redacted (recording.py)
    ("benchmarks.BenchResult", "params"), ("benchmarks.BenchResult", "metrics"),
    ("django_q.Schedule", "args"), ("django_q.Schedule", "kwargs"),  # shown on its (read-only) page
    ("django_q.OrmQ", "payload"),  # a signed pickle: a filter compares the stored text, decodes nothing
    ("journal.AggregateStream", "payload"),  # its list is the index of states (q= on stream ids): no lookups
    ("axes.AccessAttempt", "get_data"), ("axes.AccessAttempt", "post_data"),  # shown (passwords masked)
}
OUR_ADMIN_MODULES = ("journal.", "leases.", "queues.", "projections.", "benchmarks.", "loomsite.")


def data_columns() -> list[tuple[str, str, object]]:
    """(model label, column, admin) for every text, JSON or pickled column of a page Loom registers."""
    found = []
    for model, model_admin in admin.site._registry.items():
        if not type(model_admin).__module__.startswith(OUR_ADMIN_MODULES):
            continue
        for field in model._meta.concrete_fields:
            if field.get_internal_type() in ("TextField", "JSONField", "BinaryField"):
                found.append((model._meta.label, field.name, model_admin))
    return found


def test_every_data_column_of_a_loom_admin_is_withheld_from_filters_or_shown_whole():
    """A new admin page or column is covered here without a new test: name it harmless or withhold it."""
    columns = data_columns()
    assert ("journal.DataKey", "wrapped") in {(label, name) for label, name, _ in columns}
    unchecked = [(label, name) for label, name, model_admin in columns
                 if name not in getattr(model_admin, "withheld_lookups", ()) and (label, name) not in SHOWN_WHOLE]
    assert unchecked == []


@pytest.mark.parametrize(("label", "column"), sorted({(label, name) for label, name, admin_ in data_columns()
                                                      if name in getattr(admin_, "withheld_lookups", ())}))
def test_a_filter_on_a_withheld_column_is_refused(client, label, column):
    """Before: `?wrapped__startswith=<prefix>` listed the subjects whose wrapped key starts so (a prefix
    oracle for view-only staff). Now every lookup on such a column is refused, 400, whatever it would match."""
    from django.apps import apps

    model = apps.get_model(label)
    staff(client, model._meta.app_label, f"view_{model._meta.model_name}")
    url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
    assert client.get(url).status_code == 200
    for lookup in (column, f"{column}__startswith", f"{column}__isnull", f"{column}__contains"):
        assert client.get(f"{url}?{lookup}=a").status_code == 400, lookup


def test_a_data_key_cannot_be_told_by_a_prefix_of_its_wrapped_value(client):
    from journal.models import DataKey

    DataKey.objects.create(subject="alice", master_id="m1", wrapped="QUJDRA==")
    staff(client, "journal", "view_datakey")
    url = reverse("admin:journal_datakey_changelist")
    answers = {prefix: client.get(f"{url}?wrapped__startswith={prefix}").status_code for prefix in ("Q", "Z")}
    assert answers == {"Q": 400, "Z": 400}
