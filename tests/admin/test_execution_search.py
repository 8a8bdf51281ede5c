"""Finding executions (issue #28): the admin's search by an input value and by error text, its date-range
filter and error column, the same in `manage.py loom executions list` (--search, --until, `error` in
--json), and search across forget: a sealed value is never found by its clear text."""

from __future__ import annotations

import io
import json
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse
from django.utils import timezone

from journal.flows import start
from journal.models import Execution
from tests.fixtures import privacy_fixtures as fx
from tests.fixtures import schedule_flows  # noqa: F401  (sched.echo, sched.fail)

pytestmark = pytest.mark.django_db(transaction=True)
CHANGELIST = "admin:journal_execution_changelist"


@pytest.fixture(autouse=True)
def _flows(settings, tmp_path):
    settings.LOOM_FLOW_MODULES = ["tests.fixtures.schedule_flows", "tests.fixtures.privacy_fixtures",
                                  "tests.fixtures.admin_flows"]
    settings.LOOM_KEYS = [fx.KEY_A]
    settings.LOOM_CONTENT_DIR = str(tmp_path / "content")


def loom(*argv: str) -> tuple[int, object]:
    out = io.StringIO()
    try:
        call_command("loom", "executions", "list", *argv, "--json", stdout=out, stderr=io.StringIO())
        code = 0
    except CommandError as exc:
        code = exc.returncode
    return code, json.loads(out.getvalue())


def listed(admin_client, **query) -> set[str]:
    response = admin_client.get(reverse(CHANGELIST), query)
    assert response.status_code == 200
    return {row.pk for row in response.context["cl"].result_list}


def test_admin_and_cli_find_an_execution_by_an_input_value_and_by_its_error_text(admin_client):
    start("sched.echo", {"customer": "ann-4711", "n": 1}, execution_id="srch-a")
    start("sched.echo", {"customer": "bob", "n": 2}, execution_id="srch-b")
    assert start("sched.fail", {"customer": "cy"}, execution_id="srch-c").status == "failed"
    assert listed(admin_client, q="ann-4711") == {"srch-a"}
    assert listed(admin_client, q="ANN-47") == {"srch-a"}  # case-insensitive, a part of the value
    assert listed(admin_client, q="RuntimeError: boom") == {"srch-c"}  # the error text
    assert listed(admin_client, q="nobody-has-this") == set()
    assert listed(admin_client, q="srch-") == {"srch-a", "srch-b", "srch-c"}  # ids still found
    assert [r["id"] for r in loom("--search", "ann-4711")[1]] == ["srch-a"]
    code, rows = loom("--search", "boom")
    failure = "StepFailed: step 'boom' (position 0) failed after 1 attempt(s): RuntimeError: boom"
    assert code == 0 and [(r["id"], r["error"]) for r in rows] == [("srch-c", failure)]
    assert {r["id"]: r["error"] for r in loom()[1]}["srch-a"] is None  # --json always carries `error`


def test_the_error_column_shows_the_first_line_and_a_cancel_reason_as_a_reason(admin_client):
    from journal.flows import cancel
    from tests.fixtures import admin_flows as af

    assert start("sched.fail", {}, execution_id="col-f").status == "failed"
    af.CRASH = True
    try:
        with pytest.raises(af.Crash):
            start("admin.crash_once", {}, execution_id="col-c")
    finally:
        af.CRASH = False
    cancel("col-c", "cancelled by ops")
    page = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert "failed after 1 attempt(s): RuntimeError: boom</td>" in page
    assert "(cancelled: cancelled by ops)" in page
    out = io.StringIO()
    call_command("loom", "executions", "list", stdout=out)
    text = out.getvalue()
    assert "RuntimeError: boom" in text and "(cancelled: cancelled by ops)" in text


def test_the_date_range_filter_and_until_narrow_by_creation_time(admin_client):
    start("sched.echo", {"n": 1}, execution_id="when-old")
    start("sched.echo", {"n": 2}, execution_id="when-new")
    old = timezone.now() - timedelta(days=3)
    Execution.objects.filter(pk="when-old").update(created_at=old)
    day = (old - timedelta(hours=1)).date().isoformat()
    next_day = (old + timedelta(days=1)).date().isoformat()
    assert listed(admin_client, created_at__gte=day, created_at__lt=next_day) == {"when-old"}
    assert listed(admin_client, created_at__gte=timezone.now().date().isoformat()) == {"when-new"}
    assert [r["id"] for r in loom("--until", "1d")[1]] == ["when-old"]
    assert [r["id"] for r in loom("--since", "1d")[1]] == ["when-new"]
    assert loom("--until", "last tuesday")[0] == 2  # a usage error, named
    assert loom("--search", "a\x00b")[0] == 2


def test_a_sealed_input_value_is_never_found_by_its_clear_text_before_or_after_forget(admin_client):
    """The header keeps a marked field as "<redacted>": its clear text is in no column the search reads."""
    from journal.privacy import forget

    start("test.privacy.signup", {"customer_id": "c-srch", "email": "hidden-4711@example.org"},
          execution_id="srch-sealed")
    assert listed(admin_client, q="c-srch") == {"srch-sealed"}  # the unmarked field is searchable
    assert listed(admin_client, q="hidden-4711") == set()
    assert loom("--search", "hidden-4711")[1] == []
    forget("c-srch", by="test")
    assert listed(admin_client, q="hidden-4711") == set()
    assert loom("--search", "hidden-4711")[1] == []
    page = admin_client.get(reverse(CHANGELIST), {"q": "c-srch"}).content.decode()
    assert "hidden-4711" not in page
