"""The admin's "forget this subject" in a real browser (headless Chromium): the action asks for confirmation,
the click destroys the key, records who did it, and the subject's fields read as the marker afterwards."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User

from journal.envelopes import Envelope
from journal.models import DataKey, Event
from journal.privacy import AUDIT_STREAM, FORGOTTEN, keys
from tests.admin.test_browser import CHROMIUM, browser_page, click_through  # noqa: F401  (the fixture)
from tests.fixtures import privacy_fixtures as fx

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium "
                                                     "(install it with scripts/ensure-chromium)"),
]


def test_forget_subject_asks_for_confirmation_and_records_who_clicked(live_server, browser_page, settings, tmp_path):  # noqa: F811
    settings.LOOM_KEYS = [fx.KEY_A]
    settings.LOOM_CONTENT_DIR = str(tmp_path)
    keys.cache.clear()
    Event.objects.append("web-1", [Envelope("PrivacyOrder", {"customer_id": "c-web", "email": "web@example.org"})])
    Event.objects.append("web-2", [Envelope("PrivacyOrder", {"customer_id": "c-kept", "email": "kept@example.org"})])
    user = User.objects.create_user("dpo", password="pw-for-the-browser", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=["view_datakey", "forget_subject"]))

    page = browser_page
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.fill("#id_username", "dpo")
    page.fill("#id_password", "pw-for-the-browser")
    click_through(page.locator("input[type=submit]"))
    page.wait_for_url("**/admin/")
    page.goto(f"{live_server.url}/admin/journal/datakey/")
    page.locator("tr", has_text="c-web").locator("input.action-select").check()
    page.select_option("select[name=action]", "forget_subjects")
    click_through(page.locator("button[name=index]"))
    assert "c-web" in page.locator("#loom-forget-plan").inner_text()
    assert DataKey.objects.get(pk="c-web").wrapped is not None  # nothing happens before the confirmation
    click_through(page.locator("#loom-confirm"))
    page.wait_for_url("**/admin/journal/datakey/")
    assert "forgotten: c-web" in page.locator("ul.messagelist").inner_text().lower()

    assert DataKey.objects.get(pk="c-web").wrapped is None
    assert DataKey.objects.get(pk="c-kept").wrapped is not None
    assert [e.payload for e in Event.objects.read(AUDIT_STREAM)] == [{"subject": "c-web", "by": "admin:dpo"}]
    assert Event.objects.read("web-1")[0].payload["email"] == FORGOTTEN
    assert Event.objects.read("web-2")[0].payload["email"] == "kept@example.org"
