"""`manage.py loom` (journal/cli.py): every verb on real executions, its --json document and its exit
code (0 done, 1 refused or not found, 2 usage, 3 not available), through call_command; and the
command line itself in a real subprocess (argparse's usage exit, stdout JSON a script can parse)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone
from django_q.models import OrmQ
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from journal.flows import ownership as own
from journal.flows import start
from journal.models import Event, Execution
from leases import schedules as sc
from tests.conftest import ROOT
from tests.fixtures import admin_flows as af
from tests.fixtures import schedule_flows  # noqa: F401
from tests.fixtures.lease_flows import handed_over

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _flows(settings):
    settings.LOOM_FLOW_MODULES = ["tests.fixtures.admin_flows", "tests.fixtures.schedule_flows"]
    af.CRASH, af.FAIL = False, False
    installed = own.get_ownership()
    own.set_ownership(None)  # no lease keeper thread in this process
    yield
    own.set_ownership(installed)
    af.CRASH, af.FAIL = False, False


def loom(*argv: str) -> tuple[int, str, object]:
    """Run `manage.py loom ARGV --json` in-process: (exit code, stdout, parsed JSON)."""
    out = io.StringIO()
    try:
        call_command("loom", *argv, "--json", stdout=out, stderr=io.StringIO())
        code = 0
    except CommandError as exc:
        code = exc.returncode
    text = out.getvalue()
    return code, text, json.loads(text)


def crashed(execution_id: str) -> None:
    """A running execution whose run died in its second step."""
    af.CRASH = True
    try:
        with pytest.raises(af.Crash):
            start("admin.crash_once", {}, execution_id=execution_id)
    finally:
        af.CRASH = False


def failed(execution_id: str) -> None:
    assert start("sched.fail", {}, execution_id=execution_id).status == "failed"


def test_list_filters_by_status_flow_schedule_since_and_limit():
    start("sched.echo", {"n": 1}, execution_id="cli-a")
    failed("cli-b")
    start("sched.echo", {"n": 2}, execution_id="sched:nightly:2026-12-01T03:00:00Z")
    code, _, rows = loom("executions", "list")
    assert code == 0 and {r["id"] for r in rows} == {"cli-a", "cli-b", "sched:nightly:2026-12-01T03:00:00Z"}
    assert [r["id"] for r in loom("executions", "list", "--status", "failed")[2]] == ["cli-b"]
    assert {r["id"] for r in loom("executions", "list", "--flow", "sched.echo")[2]} == {
        "cli-a", "sched:nightly:2026-12-01T03:00:00Z"}
    assert [r["id"] for r in loom("executions", "list", "--schedule", "nightly")[2]] == [
        "sched:nightly:2026-12-01T03:00:00Z"]
    assert len(loom("executions", "list", "--since", "1h")[2]) == 3
    future = (timezone.now() + timedelta(hours=1)).isoformat()
    assert loom("executions", "list", "--since", future)[2] == []
    assert len(loom("executions", "list", "--limit", "2")[2]) == 2
    assert loom("executions", "list", "--status", "nonsense")[0] == 2
    assert loom("executions", "list", "--since", "yesterday")[0] == 2
    assert loom("executions", "list", "--since", "99999999999999d")[0] == 2
    assert loom("executions", "list", "--limit", "0")[0] == 2


def test_list_stuck_shows_given_up_and_lease_expired_runs():
    from journal.store import store_for as journal_store
    from leases.store import store_for

    for eid in ("cli-expired", "cli-live", "cli-given-up"):
        crashed(eid)
    store = store_for("default")
    store.acquire_many("gone-worker", [("cli-expired", 1)], 0.05)
    store.acquire_many("live-worker", [("cli-live", 1)], 3600)
    journal_store("default").mark_stuck(["cli-given-up"])
    time.sleep(0.1)  # past the short lease (what is asserted is which rows are listed, not when)
    assert sorted(r["id"] for r in loom("executions", "list", "--stuck")[2]) == ["cli-expired", "cli-given-up"]


def test_show_has_header_fence_lease_and_timeline_and_steps_the_timeline():
    failed("cli-show")
    code, _, view = loom("executions", "show", "cli-show")
    assert code == 0
    assert (view["flow"], view["status"], view["fence"], view["lease"]) == ("sched.fail", "failed", 1, None)
    assert "boom" in view["error"] and view["steps"][0]["step"] == "boom"
    assert view["steps"][0]["status"] == "failed"
    code, _, steps = loom("executions", "steps", "cli-show")
    assert code == 0 and steps == view["steps"]
    out = io.StringIO()
    call_command("loom", "executions", "show", "cli-show", stdout=out)
    assert "fence     1" in out.getvalue() and "timeline:" in out.getvalue()


def test_unknown_execution_is_exit_1_with_a_json_error():
    code, _, error = loom("executions", "show", "no-such-execution")
    assert code == 1 and error["ok"] is False and error["type"] == "UnknownExecution"
    assert loom("executions", "steps", "no-such-execution")[0] == 1
    assert loom("executions", "cancel", "no-such-execution")[0] == 1


def test_cancel_a_running_execution_and_refuse_a_completed_one():
    crashed("cli-cancel")
    code, _, out = loom("executions", "cancel", "cli-cancel")
    assert code == 0 and out["status"] == "cancelled"
    assert Execution.objects.get(pk="cli-cancel").status == "cancelled"
    assert Event.objects.read("cli-cancel")[-1].type == "EXECUTION_CANCELLED"
    start("sched.echo", {}, execution_id="cli-done")
    code, _, error = loom("executions", "cancel", "cli-done")
    assert code == 1 and error["type"] == "NotResumable"
    assert Execution.objects.get(pk="cli-done").status == "completed"


def test_resume_hands_a_crashed_run_to_a_worker_and_refuses_a_settled_one():
    crashed("cli-resume")
    code, _, out = loom("executions", "resume", "cli-resume")
    assert code == 0 and out["handed_over"] is True and out["fence"] == 1
    assert [t["args"][0] for t in handed_over()] == ["cli-resume"]  # issue #24: a resume entry, not a q2 task
    start("sched.echo", {}, execution_id="cli-settled")
    assert loom("executions", "resume", "cli-settled")[0] == 1
    assert len(handed_over()) == 1


def test_retry_records_a_new_attempt_of_a_failed_execution_only():
    failed("cli-retry")
    code, _, out = loom("executions", "retry", "cli-retry")
    assert code == 0 and out["retried"] is True
    assert Event.objects.read("cli-retry")[-1].type == "EXECUTION_RETRIED"
    assert Execution.objects.get(pk="cli-retry").status == "running"
    start("sched.echo", {}, execution_id="cli-ok")
    code, _, error = loom("executions", "retry", "cli-ok")
    assert code == 1 and error["type"] == "NotResumable"


def test_fork_says_it_is_not_available_without_flows_that_wait():
    import journal.flows as flows

    start("sched.echo", {}, execution_id="cli-fork")
    code, _, error = loom("executions", "fork", "cli-fork", "--from-step", "1")
    if hasattr(flows, "fork") or "fork" in getattr(flows, "_LAZY", {}):  # the flows-that-wait work merged
        assert code == 0 and error["forked"]
    else:
        assert code == 3 and "not available" in error["error"]


def test_schedules_lists_every_schedule_with_its_ticks():
    sc.define("cli-nightly", "0 3 * * *", "sched.echo", {"full": True}, catch_up="once")
    code, _, rows = loom("schedules")
    assert code == 0 and [r["name"] for r in rows] == ["cli-nightly"]
    assert (rows[0]["cron"], rows[0]["catch_up"], rows[0]["input"], rows[0]["last_tick_at"]) == (
        "0 3 * * *", "once", {"full": True}, None)
    assert rows[0]["next_tick_at"].endswith("03:00:00+00:00") and rows[0]["timezone"] == "UTC"


def test_schedules_shows_each_schedules_time_zone_and_its_ticks_in_utc():
    """A Paris 09:00 schedule: its zone is listed (JSON and table), its next tick is the UTC instant
    (08:00 UTC in winter, 07:00 in summer)."""
    sc.define("cli-paris", "0 9 * * *", "sched.echo", timezone="Europe/Paris")
    code, _, rows = loom("schedules")
    assert code == 0 and (rows[0]["name"], rows[0]["timezone"]) == ("cli-paris", "Europe/Paris")
    assert rows[0]["next_tick_at"][11:] in ("08:00:00+00:00", "07:00:00+00:00")
    out = io.StringIO()
    call_command("loom", "schedules", stdout=out, stderr=io.StringIO())
    assert "time zone" in out.getvalue() and "Europe/Paris" in out.getvalue()


def test_queues_lists_caps_depth_and_running_and_filters_executions_by_queue():
    from queues import declare_queue, enqueue
    from queues.declarations import forget

    declare_queue("cli-mail", concurrency=3)
    try:
        first = enqueue("sched.echo", {"n": 1}, queue="cli-mail", execution_id="cli-q1")
        enqueue("sched.echo", {"n": 2}, queue="cli-mail", execution_id="cli-q2")
        code, _, queues = loom("queues")
        row = next(q for q in queues if q["name"] == "cli-mail")
        assert code == 0 and (row["concurrency"], row["pending"], row["running"]) == (3, 2, 0)
        start("sched.echo", {}, execution_id="cli-not-queued")
        # Issue #24: both queued starts are executions already (status queued), listed with their queue.
        listed = loom("executions", "list", "--queue", "cli-mail")[2]
        assert sorted(r["id"] for r in listed) == [first.execution_id, "cli-q2"]
        code, _, out = loom("executions", "cancel", "cli-q2")  # pending, not started: its entry is cancelled
        assert code == 0 and out["queued"] is True
        from queues.models import QueueEntry

        enqueue("sched.echo", {"n": 3}, queue="cli-mail", execution_id="cli-q3")
        QueueEntry.objects.filter(execution_id="cli-q3").update(state="started", worker="w")  # as a claim does
        code, _, out = loom("executions", "cancel", "cli-q3")  # claimed, not begun: its entry is cancelled
        assert code == 0 and out["queued"] is True
        assert QueueEntry.objects.get(execution_id="cli-q3").state == "cancelled"  # the runner's begin refuses it
    finally:
        forget("cli-mail")


def test_the_command_line_exit_codes_and_json_in_a_real_process(child_env):
    """What a shell script sees: JSON on stdout, exit 0; argparse's usage error exits 2; not found 1."""
    start("sched.echo", {"n": 7}, execution_id="cli-proc")

    def run(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "manage.py", "loom", *argv], cwd=ROOT, env=child_env,
                              capture_output=True, text=True, timeout=120)

    shown = run("executions", "show", "cli-proc", "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["result"] == {"n": 7}
    assert run("executions", "frobnicate").returncode == 2
    missing = run("executions", "show", "nope", "--json")
    assert missing.returncode == 1 and json.loads(missing.stdout)["ok"] is False


def test_unusable_filter_text_limits_and_aliases_are_usage_errors_with_a_json_document():
    """Text a mangled argv gives (a lone surrogate), a NUL, a --limit beyond the bound, an unknown
    --database: exit 2 and a JSON error, never a traceback."""
    for option in ("--flow", "--queue", "--schedule"):
        for bad in ("\udcff", "a\x00b", "x" * 201):
            code, _, error = loom("executions", "list", option, bad)
            assert code == 2 and error["ok"] is False, (option, bad)
    assert loom("executions", "list", "--limit", "99999999999999999999")[0] == 2
    for argv in (("queues",), ("schedules",), ("executions", "list"), ("executions", "show", "x")):
        code, _, error = loom(*argv, "--database", "nope")
        assert code == 2 and "nope" in error["error"]
    crashed("cli-bad-reason")
    assert loom("executions", "cancel", "cli-bad-reason", "--reason", "\udcff")[0] == 2
    assert Execution.objects.get(pk="cli-bad-reason").status == "running"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(execution_id=st.text(max_size=220), verb=st.sampled_from(["show", "steps", "cancel", "resume", "retry"]),
       option=st.sampled_from(["--since", "--flow", "--queue", "--schedule", "--status"]), text=st.text(max_size=210))
def test_any_id_or_filter_text_is_answered_with_an_exit_code_and_nothing_written(execution_id, verb, option, text):
    """Whatever a script passes (ids and every text option), the answer is a refusal (1), a usage error (2)
    or a listing, with a JSON document, never a traceback, and nothing is written (no execution exists)."""
    if execution_id.startswith("-"):
        execution_id = "x" + execution_id  # argparse would read it as an option: a different test
    code, _, error = loom("executions", verb, execution_id)
    assert code in (1, 2) and error["ok"] is False and error["error"]
    code, _, listed = loom("executions", "list", f"{option}={text}")
    assert (code == 0 and listed == []) or (code == 2 and listed["ok"] is False)
    assert not Event.objects.exists() and not OrmQ.objects.exists()


def test_show_and_steps_redact_sensitive_fields_unless_reveal(settings, tmp_path):
    """Before: `show` and `steps` printed the Sensitive email of the input and of the step's result in clear,
    to anyone at the terminal and into any log the output went to. Now `<redacted>` unless `--reveal`."""
    from journal.privacy import keys
    from tests.fixtures import privacy_fixtures as fx

    settings.LOOM_KEYS = [fx.KEY_A]
    settings.LOOM_CONTENT_DIR = str(tmp_path / "content")
    keys.cache.clear()
    try:
        start("test.privacy.signup", {"customer_id": "c-1", "email": "ann@example.com"}, execution_id="cli-pii")
        for verb in ("show", "steps"):
            code, text, _ = loom("executions", verb, "cli-pii")
            assert code == 0 and "ann@example.com" not in text and "<redacted>" in text, (verb, text)
            out = io.StringIO()
            call_command("loom", "executions", verb, "cli-pii", stdout=out)  # the text form too
            assert "ann@example.com" not in out.getvalue()
            code, text, _ = loom("executions", verb, "cli-pii", "--reveal")
            assert code == 0 and "ann@example.com" in text
        _, _, shown = loom("executions", "show", "cli-pii", "--reveal")
        assert shown["input"]["email"] == "ann@example.com"
        assert shown["steps"][0]["result"]["text"] == "hi ann@example.com"
        _, _, redacted = loom("executions", "show", "cli-pii")
        assert redacted["input"] == {"customer_id": "c-1", "email": "<redacted>"}
        assert redacted["steps"][0]["result"]["text"] == "<redacted>"
    finally:
        keys.cache.clear()
