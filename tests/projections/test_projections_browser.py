"""The subscription admin's actions clicked in headless Chromium (no JavaScript): a view-only staff user
is offered none, and "Reset: replay" shows what it will wipe and acts only once confirmed."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User

from journal.envelopes import Envelope
from journal.models import Event
from projections.declarations import registry
from projections.models import Subscription
from projections.service import drain
from tests.admin.test_browser import CHROMIUM, browser_page, click_through  # noqa: F401  (the fixture)
from tests.projections.test_projections_admin import wipe
from tests.projections.test_projections_helpers import applied, create_table, declare_counter

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium "
                                                     "(install it with scripts/ensure-chromium)"),
]


def user(name: str, *perms: str) -> None:
    staff = User.objects.create_user(name, password="pw-for-the-browser", is_staff=True)
    staff.user_permissions.set(Permission.objects.filter(content_type__app_label="projections", codename__in=perms))


def log_in(page, live_server, name: str) -> None:
    page.goto(f"{live_server.url}/admin/login/?next=/admin/projections/subscription/")
    page.fill("#id_username", name)
    page.fill("#id_password", "pw-for-the-browser")
    click_through(page.locator("input[type=submit]"))
    page.wait_for_url("**/admin/projections/subscription/")


def test_reset_replay_is_confirmed_in_the_browser_and_hidden_from_view_only_staff(live_server, browser_page):  # noqa: F811
    registry.clear()
    create_table()
    try:
        declare_counter(reset=wipe)
        Event.objects.append("a", [Envelope("Tick"), Envelope("Tick")])
        drain()
        user("viewer", "view_subscription")
        user("operator", "view_subscription", "replay_subscription")
        page = browser_page

        log_in(page, live_server, "viewer")
        assert page.locator("select[name=action]").count() == 0  # no action offered at all
        page.context.clear_cookies()  # log out

        log_in(page, live_server, "operator")
        options = page.locator("select[name=action] option").all_inner_texts()
        assert any("Reset" in o for o in options) and not any("Unblock" in o for o in options)
        page.locator("input[name=_selected_action]").first.check()
        page.select_option("select[name=action]", "reset_replay")
        click_through(page.locator("button[name=index]"))
        body = page.locator("#content").inner_text()
        assert "its read model is wiped" in body and "1 subscription(s)" in body
        assert applied() == [("a", 0), ("a", 1)]  # nothing happened yet
        click_through(page.locator("input[type=submit][value='Yes, reset and replay']"))
        page.wait_for_url("**/admin/projections/subscription/")
        assert "reset for replay" in page.locator("ul.messagelist").inner_text()
        assert applied() == [] and Subscription.objects.get(stream="a").at == -1
    finally:
        registry.clear()
