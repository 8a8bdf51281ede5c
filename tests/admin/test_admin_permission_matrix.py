"""The admin permission matrix (issue 25), generated from the admin registry: every page of every registered
ModelAdmin (its own URLs included: the execution page's resume, retry, cancel...), and every action, for a
staff user with no permission, one with every view permission, and narrow ones (one permission of the model,
alone and with its view permission), then a superuser.

- No request answers 500 (the test client raises what a view raises).
- View-only and permission-less staff are offered no action and change nothing: every POST (add, change,
  delete, each custom page, each action with "post=yes") leaves every table as it was.
- A narrow user changes nothing through a page or action its admin does not grant it (has_*_permission and
  get_actions, asked for that user): e.g. `leases.add_schedule` alone adds schedules and nothing else.

A page or action added later (a QueueEntry admin, say) is in the matrix without a new test. Runs on whichever
database the suite runs on (SQLite and PostgreSQL in CI).
"""

from __future__ import annotations

import hashlib
import re
import uuid

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission, User
from django.test import Client, RequestFactory
from django.utils import timezone

from journal.flows import ownership as own
from journal.flows import start
from tests.fixtures import admin_flows, schedule_flows  # noqa: F401  (the flows seed() starts)

pytestmark = pytest.mark.django_db

NOT_TRACKED = {"sessions.Session", "axes.AccessLog", "axes.AccessAttempt", "axes.AccessFailureLog",
               "auth.Permission", "contenttypes.ContentType"}
"""Tables a login writes, and the static ones (no admin page writes them); every other table is compared."""


@pytest.fixture(autouse=True)
def _flows(settings):
    settings.LOOM_FLOW_MODULES = ["tests.fixtures.admin_flows", "tests.fixtures.schedule_flows"]
    installed = own.get_ownership()
    own.set_ownership(None)  # no lease keeper thread in this process
    yield
    own.set_ownership(installed)


def seed() -> None:
    """At least one row behind as many pages as possible (a page without one is asked with a missing id)."""
    from axes.models import AccessAttempt, AccessFailureLog, AccessLog
    from django.contrib.auth.models import Group
    from django_q.models import Schedule as QSchedule
    from django_q.models import Task
    from django_q.tasks import async_task

    from benchmarks.models import BenchResult, BenchRun
    from journal.models import DataKey, Fence, Snapshot
    from leases import schedules as sc
    from leases.models import Worker
    from leases.store import store_for as lease_store
    from projections.models import Checkpoint, Subscription
    from queues.models import Queue
    from tests.fixtures import admin_flows as af

    start("sched.echo", {"n": 1}, execution_id="matrix-done")
    assert start("sched.fail", {}, execution_id="matrix-failed").status == "failed"
    af.CRASH = True
    try:
        with pytest.raises(af.Crash):
            start("admin.crash_once", {}, execution_id="matrix-running")
    finally:
        af.CRASH = False
    now = timezone.now()
    Worker.objects.create(id="matrix-worker", host="h", pid=1)
    token = Fence.objects.current("matrix-running")
    assert lease_store().acquire_many("matrix-worker", [("matrix-running", token)], 30.0) == {"matrix-running"}
    Snapshot.objects.create(stream_id="matrix-done", seq=1, state={"n": 1})
    DataKey.objects.create(subject="matrix-subject", master_id="m", wrapped="QUJD")
    Queue.objects.create(name="matrix-queue", concurrency=2, partition_concurrency=1)
    Subscription.objects.create(consumer="matrix", stream="s", at=1, tip=3, blocked=True, error="boom")
    Checkpoint.objects.create(consumer="matrix", position=3)
    run = BenchRun.objects.create(command="bench_x", argv="bench_x")
    BenchResult.objects.create(run=run, section="s", scenario="x")
    sc.define("matrix-nightly", "0 3 * * *", "sched.echo", {"n": 1})
    for success in (True, False):
        Task.objects.create(id=uuid.uuid4().hex, name=f"matrix-{success}", func="math.floor", args=(1.5,), kwargs={},
                            started=now, stopped=now, success=success, result=1)
    QSchedule.objects.create(name="matrix", func="math.floor", args="1.5")
    async_task("math.floor", 1.5)  # an OrmQ row
    common = {"ip_address": "10.0.0.1", "user_agent": "ua", "http_accept": "", "path_info": "/admin/login/"}
    AccessAttempt.objects.create(username="u", get_data="", post_data="", failures_since_start=1, **common)
    AccessLog.objects.create(username="u", **common)
    AccessFailureLog.objects.create(username="u", locked_out=False, **common)
    Group.objects.create(name="matrix")


def snapshot() -> str:
    """A digest of every tracked table's rows: what "changed nothing" is checked against."""
    digest = hashlib.sha256()
    for model in sorted(apps.get_models(), key=lambda m: m._meta.label):
        if model._meta.proxy or not model._meta.managed or model._meta.label in NOT_TRACKED:
            continue
        rows = sorted(repr(row) for row in model._base_manager.values_list())
        digest.update(f"{model._meta.label}:{rows}".encode())
    return digest.hexdigest()


def registry() -> list[tuple[str, admin.ModelAdmin]]:
    return sorted(((model._meta.label, model_admin) for model, model_admin in admin.site._registry.items()),
                  key=lambda item: item[0])


def make_user(codenames: list[tuple[str, str]] | None, superuser: bool = False) -> User:
    user = User.objects.create_user(f"m-{uuid.uuid4().hex[:10]}", is_staff=True, is_superuser=superuser)
    if codenames:
        wanted = [Permission.objects.get(content_type__app_label=app, codename=code) for app, code in codenames]
        user.user_permissions.set(wanted)
    return User.objects.get(pk=user.pk)  # no cached permissions


def users_for(model) -> list[tuple[str, User]]:
    """(kind, user): none, view-only (every view permission), then narrow ones: each permission of `model`
    (of its concrete model too, for a proxy) alone, and with the model's view permission."""
    views = [(p.content_type.app_label, p.codename) for p in
             Permission.objects.filter(codename__startswith="view_").select_related("content_type")]
    own_perms = set()
    for each in {model, model._meta.concrete_model}:
        own_perms |= {(p.content_type.app_label, p.codename) for p in Permission.objects.filter(
            content_type__app_label=each._meta.app_label, content_type__model=each._meta.model_name)
            .select_related("content_type")}
    view = (model._meta.app_label, f"view_{model._meta.model_name}")
    if view not in own_perms:
        view = (model._meta.concrete_model._meta.app_label, f"view_{model._meta.concrete_model._meta.model_name}")
    kinds = [("none", make_user(None)), ("view-only", make_user(views))]
    for perm in sorted(own_perms - {view}):
        kinds.append((f"only {perm[1]}", make_user([perm])))
        kinds.append((f"{view[1]} + {perm[1]}", make_user([view, perm])))
    return kinds


def request_as(user) -> object:
    request = RequestFactory().get("/admin/")
    request.user = user
    return request


def pages(model_admin, obj) -> list[str]:
    """Every URL of the ModelAdmin, with the row's quoted pk (or a missing one) for its object parameters;
    not the bare `<id>/` (a redirect to its change page)."""
    pk = quote(str(obj.pk)) if obj is not None else "matrix-missing"
    prefix = f"/admin/{model_admin.model._meta.app_label}/{model_admin.model._meta.model_name}/"
    urls = []
    for pattern in model_admin.get_urls():
        text = str(pattern.pattern)
        if text == "<path:object_id>/":
            continue
        urls.append(prefix + re.sub(r"<(?:[a-z]+:)?[a-z_]+>", pk, text))
    return urls


def grants(model_admin, user, page: str, obj) -> bool:
    """Does the admin itself grant `user` the write this page does (standard pages only)?"""
    request = request_as(user)
    if page.endswith("/add/"):
        return model_admin.has_add_permission(request)
    if page.endswith("/change/"):
        return model_admin.has_change_permission(request, obj)
    if page.endswith("/delete/"):
        return model_admin.has_delete_permission(request, obj)
    return True  # a custom page: its own permission, asked by the page (only "no 500" is checked for it)


MATRIX = [label for label, _ in registry()]


@pytest.mark.parametrize("label", MATRIX)
def test_every_page_and_action_for_every_kind_of_staff(label):
    model_admin = dict(registry())[label]
    model = model_admin.model
    seed()
    root_request = request_as(User(username="root", is_active=True, is_staff=True, is_superuser=True))
    obj = model_admin.get_queryset(root_request).first()  # picked before any user of the matrix exists
    urls = pages(model_admin, obj)
    actions = sorted(model_admin.get_actions(root_request))
    changelist = f"/admin/{model._meta.app_label}/{model._meta.model_name}/"
    selected = [obj.pk] if obj is not None else []
    for kind, user in [*users_for(model), ("superuser", make_user(None, superuser=True))]:
        client = Client()
        client.force_login(user)
        offered = model_admin.get_actions(request_as(user))
        if kind == "view-only":
            assert not offered, f"{label}: view-only staff are offered {sorted(offered)}"
        for url in urls:
            client.get(url)  # raises (fails the test) on a 500
        acting = kind not in ("none", "view-only")
        posts = [(url, {"post": "yes", "_save": "Save"}) for url in urls if not url.endswith("/history/")]
        posts += [(changelist, {"action": action, "_selected_action": selected, "index": 0, "post": "yes"})
                  for action in actions]
        refused = [(url, data) for url, data in posts if kind != "superuser" and (
            not acting or ("action" in data and data["action"] not in offered)
            or ("action" not in data and not grants(model_admin, user, url, obj)))]
        state = snapshot()  # after the login (it writes the user's last_login)
        for url, data in refused:  # first what this user may not do: nothing may change
            client.post(url, data)
        assert snapshot() == state, f"{label}: {kind} changed the database by one of {refused}"
        for url, data in posts:  # then what it may: whatever it does, no 500
            if (url, data) not in refused:
                client.post(url, data)
