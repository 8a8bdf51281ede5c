"""The subscription admin: its actions need their own permissions, and a reset confirms first (issue 12)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection

from journal.envelopes import Envelope
from journal.models import Event
from projections.declarations import registry
from projections.models import Subscription
from projections.service import drain
from tests.projections.test_projections_helpers import TABLE, applied, create_table, declare_counter

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = "/admin/projections/subscription/"


def wipe() -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {TABLE}")


@pytest.fixture(autouse=True)
def projected():
    """A projection with a reset hook, two events applied, and one blocked subscription."""
    registry.clear()
    create_table()
    declare_counter(reset=wipe)
    Event.objects.append("a", [Envelope("Tick"), Envelope("Tick")])
    drain()
    Event.objects.append("b", Envelope("Tick"))
    drain()
    Subscription.objects.filter(stream="b").update(blocked=True, error="boom")
    yield
    registry.clear()


def staff(client, *perms: str) -> User:
    user = User.objects.create_user("staffer", password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="projections", codename__in=perms))
    client.force_login(user)
    return user


def act(client, action: str, **extra):
    ids = [str(pk) for pk in Subscription.objects.values_list("pk", flat=True)]
    return client.post(CHANGELIST, {"action": action, "_selected_action": ids, **extra})


def state() -> tuple:
    rows = Subscription.objects.order_by("stream")
    return [(s.stream, s.at, s.blocked) for s in rows], applied()


def test_a_view_only_staff_user_can_see_but_run_no_action(client):
    staff(client, "view_subscription")
    page = client.get(CHANGELIST)
    assert page.status_code == 200
    body = page.content.decode()
    assert 'value="unblock"' not in body and 'value="reset_replay"' not in body
    before = state()
    for action in ("unblock", "reset_replay"):
        act(client, action, post="yes")
        assert state() == before  # the read model and the watermarks are untouched
    assert client.get(f"{CHANGELIST}{Subscription.objects.first().pk}/delete/").status_code == 403


def test_unblock_needs_its_own_permission(client):
    staff(client, "view_subscription", "change_subscription")
    act(client, "unblock")
    assert Subscription.objects.get(stream="b").blocked  # change alone does not allow it
    User.objects.get(username="staffer").user_permissions.add(Permission.objects.get(codename="unblock_subscription"))
    act(client, "unblock")
    assert not Subscription.objects.get(stream="b").blocked


def test_reset_shows_what_it_will_do_and_acts_only_once_confirmed(client):
    staff(client, "view_subscription", "replay_subscription")
    before = state()
    page = act(client, "reset_replay")
    body = page.content.decode()
    assert page.status_code == 200
    assert "counter" in body and "2 subscription(s)" in body and "its read model is wiped" in body
    assert 'name="post" value="yes"' in body
    assert state() == before  # the confirmation page changed nothing
    act(client, "reset_replay", post="yes")
    assert applied() == []  # the reset hook wiped the read model
    assert all(s.at == -1 and not s.blocked for s in Subscription.objects.all())
    drain()
    assert applied() == [("a", 0), ("a", 1), ("b", 0)]


def test_a_superuser_runs_both_actions(admin_client):
    act(admin_client, "unblock")
    assert not Subscription.objects.get(stream="b").blocked
    act(admin_client, "reset_replay", post="yes")
    assert applied() == [] and all(s.at == -1 for s in Subscription.objects.all())
