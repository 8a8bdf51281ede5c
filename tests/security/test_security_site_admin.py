"""The demo site's own admin pages and sessions (issue 25): django-axes' attempts page, and what a
database reader can do with `django_session`."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.contrib.auth.models import Permission, User
from django.urls import reverse
from django.utils import timezone

pytestmark = pytest.mark.django_db


def staff(client, *codenames: str) -> User:
    user = User.objects.create_user(f"staff-{uuid.uuid4().hex[:8]}", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="axes", codename__in=codenames))
    client.force_login(user)
    return user


def attempts() -> tuple[AccessAttempt, AccessAttempt]:
    old, fresh = (AccessAttempt.objects.create(username=name, ip_address="10.0.0.1", user_agent="ua", get_data="",
                                               post_data="", http_accept="", path_info="/admin/login/",
                                               failures_since_start=1) for name in ("old", "fresh"))
    AccessAttempt.objects.filter(pk=old.pk).update(attempt_time=timezone.now() - timedelta(days=2))
    return old, fresh


def cleanup(client):
    return client.post(reverse("admin:axes_accessattempt_changelist"),
                       {"action": "cleanup_expired_attempts",
                        "_selected_action": list(AccessAttempt.objects.values_list("pk", flat=True))})


def test_view_only_staff_are_not_offered_the_cleanup_and_cannot_run_it(client):
    """Before: offered to view-only staff, and the POST answered 500. Now: not offered, nothing deleted."""
    staff(client, "view_accessattempt")  # a login cleans expired attempts itself: log in first
    attempts()
    page = client.get(reverse("admin:axes_accessattempt_changelist"))
    assert page.status_code == 200 and 'value="cleanup_expired_attempts"' not in page.content.decode()
    assert cleanup(client).status_code in (200, 302)
    assert AccessAttempt.objects.count() == 2


def test_the_cleanup_deletes_expired_attempts_for_staff_who_may_delete_them(client):
    """Before: 500 (axes read request.axes_attempt_time, set only by its login handler), for superusers too."""
    staff(client, "view_accessattempt", "delete_accessattempt")
    attempts()
    response = cleanup(client)
    assert response.status_code == 302
    assert list(AccessAttempt.objects.values_list("username", flat=True)) == ["fresh"]
    assert "Cleaned up 1 expired access attempts." in client.get(response["Location"]).content.decode()


# -- sessions: nothing in the database to replay --------------------------------------------------------------

def test_a_database_reader_finds_no_session_to_replay(client):
    """Before (the database session engine): a role that may only SELECT read the superuser's live session
    key from django_session, sent it as its own cookie and had the admin. Now nothing there lets a second
    client in: loomsite keeps sessions in a signed cookie."""
    from django.contrib.sessions.models import Session
    from django.test import Client

    User.objects.create_superuser("root", "root@example.com", "a long passphrase 42")
    login = client.post(reverse("admin:login"), {"username": "root", "password": "a long passphrase 42",
                                                 "next": reverse("admin:index")})
    assert login.status_code == 302 and client.get(reverse("admin:index")).status_code == 200
    stored = list(Session.objects.values_list("session_key", flat=True))
    for key in stored:  # what a reader of django_session would replay
        replayer = Client()
        replayer.cookies["sessionid"] = key
        assert replayer.get(reverse("admin:index")).status_code == 302  # to the login page
    assert stored == []


def test_the_check_warns_a_host_project_that_keeps_sessions_in_the_database(settings):
    from journal.checks import check_session_engine

    assert check_session_engine() == []  # loomsite: signed cookies
    for engine in ("django.contrib.sessions.backends.db", "django.contrib.sessions.backends.cached_db"):
        settings.SESSION_ENGINE = engine
        warnings = check_session_engine()
        assert [w.id for w in warnings] == ["loom.W040"] and "docs/security.md" in warnings[0].hint
    settings.SESSION_ENGINE = "django.contrib.sessions.backends.cache"
    assert check_session_engine() == []
