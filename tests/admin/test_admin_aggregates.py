"""The aggregates' admin pages as real admin pages: listed on the admin index, rendered with the admin's
context (who is logged in, a logout form that works, styled breadcrumbs), guarded by a model permission.

Reproduces issue 13 ("WELCOME, .", unstyled breadcrumbs, logout 403, nothing links to them) and issue 12
(a staff user with no permission saw every aggregate stream)."""

from __future__ import annotations

import django
import pytest
from django.contrib.auth.models import Permission, User
from pydantic import BaseModel

from journal.aggregates import State, do

pytestmark = pytest.mark.django_db


class Lamp(BaseModel):
    on: bool = False


class Switched(BaseModel):
    on: bool


lamp = State("AdminLamp", Lamp)


@lamp.on(Switched)
def _(state: Lamp, e: Switched) -> dict:
    return {"on": e.on}


@lamp.action(Switched)
def switch(state: Lamp, cmd: Switched) -> Switched:
    return Switched(on=cmd.on)


PAGES = ("/admin/journal/aggregatestream/", "/admin/journal/aggregatestream/AdminLamp/",
         "/admin/journal/aggregatestream/AdminLamp/hall/")


def test_the_admin_index_links_to_the_aggregate_pages(admin_client):
    index = admin_client.get("/admin/").content.decode()
    assert 'href="/admin/journal/aggregatestream/"' in index and ">Aggregates<" in index


@pytest.mark.parametrize("url", (*PAGES, "/admin/aggregates/AdminLamp/hall/"))
def test_aggregate_pages_render_with_the_admin_context(admin_client, url):
    do(switch, "hall", {"on": True}, actor="ann")
    page = admin_client.get(url)
    body = page.content.decode()
    assert page.status_code == 200
    assert "<strong>admin</strong>" in body  # "Welcome, admin." rather than "WELCOME, ."
    assert 'id="logout-form"' in body and "csrfmiddlewaretoken" in body
    assert ('<ol class="breadcrumbs">' if django.VERSION >= (6, 0) else '<div class="breadcrumbs">') in body
    assert "AdminLamp" in body


def test_logout_from_an_aggregate_page_works(admin_client):
    page = admin_client.get(PAGES[0])
    token = page.context["csrf_token"]
    response = admin_client.post("/admin/logout/", {"csrfmiddlewaretoken": str(token)})
    assert response.status_code in (200, 302)
    assert admin_client.get(PAGES[0]).status_code == 302  # logged out: sent to the login page


def test_aggregate_pages_need_their_view_permission(client):
    do(switch, "hall", {"on": True})
    user = User.objects.create_user("op", password="pw", is_staff=True)
    client.force_login(user)
    for url in (*PAGES, "/admin/aggregates/", "/admin/aggregates/AdminLamp/hall/"):
        assert client.get(url).status_code == 403, url
    assert b"aggregatestream" not in client.get("/admin/").content
    user.user_permissions.add(Permission.objects.get(codename="view_aggregatestream"))
    client.force_login(User.objects.get(pk=user.pk))
    for url in PAGES:
        assert client.get(url).status_code == 200, url
