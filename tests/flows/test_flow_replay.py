"""The replay check (docs/flows.md "The replay check", docs/cli.md): `manage.py loom replay` and
`journal.flows.testing.replay` replay recorded histories against the code of the process, write nothing,
and fail naming the first execution and position a resume would refuse. Both databases.

The code changes under recorded executions through tests/fixtures/version_flows.py's CODE["variant"] (in this
process) or LOOM_TEST_VARIANT (a child process: the command as a deploy's CI runs it)."""

from __future__ import annotations

import json
import subprocess
import sys
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from journal.flows import start
from journal.flows.ownership import get_ownership, set_ownership
from journal.flows.replay import History, InvalidHistory, replay_history
from journal.flows.testing import replay
from journal.models import Event, Execution, Fence, Snapshot
from tests.conftest import ROOT
from tests.fixtures import version_flows

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def recorded(settings):
    """Three executions of release "old" waiting on a message (recorded: reserve, then the recv begun)."""
    settings.LOOM_WAIT_INLINE_MAX = 0.0
    installed = get_ownership()
    set_ownership(None)
    version_flows.CODE.update(variant="old", stop_once=False)
    for n in range(3):
        assert start("ver.replayed", {"n": n}, execution_id=f"rp-{n}").status == "waiting"
    yield
    set_ownership(installed)
    version_flows.CODE.update(variant="old", stop_once=False)


def rows() -> tuple[int, ...]:
    return (Event.objects.count(), Execution.objects.count(), Fence.objects.count(), Snapshot.objects.count(),
            tuple(Fence.objects.order_by("stream_id").values_list("token", flat=True)))


def loom_replay(*args: str) -> tuple[int, dict]:
    out = StringIO()
    try:
        call_command("loom", "replay", *args, "--json", stdout=out)
        code = 0
    except CommandError as exc:
        code = exc.returncode
    return code, json.loads(out.getvalue())


def test_replay_passes_on_a_compatible_change_and_writes_nothing():
    before = rows()
    version_flows.CODE["variant"] = "compatible"
    code, results = loom_replay("--flow", "ver.replayed")
    assert code == 0
    assert sorted(r["execution_id"] for r in results) == ["rp-0", "rp-1", "rp-2"]
    assert all(r["ok"] and r["replayed"] == 2 for r in results)
    assert [r.ok for r in replay(flows=["ver.replayed"])] == [True] * 3
    assert rows() == before  # nothing written: no event, fence, header or snapshot


def test_replay_fails_on_an_incompatible_change_naming_the_execution_and_the_position():
    before = rows()
    version_flows.CODE["variant"] = "incompatible"
    code, refused = loom_replay("rp-1")
    assert code == 1 and refused["type"] == "NonDeterminism"
    assert "rp-1 at position 1" in refused["error"] and "fraud-check" in refused["error"]
    [result] = refused["results"]
    assert (result["position"], result["recorded"], result["requested"]) == (1, "$recv:go", "fraud-check")
    with pytest.raises(AssertionError, match=r"rp-0 \(ver.replayed v1\) at position 1"):
        replay(["rp-0", "rp-2"])
    assert rows() == before


def test_an_exported_history_replays_from_its_file(tmp_path):
    out = StringIO()
    call_command("loom", "executions", "export", "rp-2", stdout=out)
    path = tmp_path / "rp-2.json"
    path.write_text(out.getvalue())
    assert json.loads(out.getvalue())["events"][0]["type"] == "EXECUTION_STARTED"
    version_flows.CODE["variant"] = "compatible"
    assert loom_replay("--file", str(path))[0] == 0
    replay(histories=[str(path)])
    version_flows.CODE["variant"] = "incompatible"
    code, refused = loom_replay("--file", str(path))
    assert code == 1 and refused["results"][0]["position"] == 1
    with pytest.raises(AssertionError, match="rp-2"):
        replay(histories=[str(path)])


def test_replay_in_a_child_process_exits_non_zero_on_the_incompatible_release_only(child_env):
    def run(variant: str) -> subprocess.CompletedProcess:
        env = {**child_env, "LOOM_TEST_VARIANT": variant, "LOOM_FLOW_MODULES": "tests.fixtures.version_flows"}
        return subprocess.run([sys.executable, "manage.py", "loom", "replay", "--flow", "ver.replayed"], env=env,
                              cwd=ROOT, capture_output=True, text=True, timeout=120)

    ok = run("compatible")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "3 history(ies) replayed, 0 would not resume" in ok.stdout
    bad = run("incompatible")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "at position 1" in bad.stderr and "FAIL  rp-" in bad.stdout


def test_completed_executions_are_replayed_only_when_asked_and_then_the_whole_log_counts():
    from journal.flows import send, wake_due

    send("rp-0", "go", None)
    assert [o.status for o in wake_due()] == ["completed"]
    version_flows.CODE["variant"] = "compatible"  # a new step after the wait: rp-0's log has ship there
    assert sorted(r.execution_id for r in replay(flows=["ver.replayed"])) == ["rp-1", "rp-2"]
    with pytest.raises(AssertionError, match=r"rp-0 .* at position 2"):
        replay(flows=["ver.replayed"], settled=True)


def test_a_missing_version_or_flow_and_a_bad_history_file_are_named(tmp_path):
    from journal.flows.replay import history_of

    history = history_of("rp-0").to_json()
    history["events"][0]["payload"]["$version"] = 7
    result = replay_history(History.from_json(history))
    assert not result.ok and result.problem == "UnknownFlow" and "version 7" in result.reason
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "loom-history/1", "execution_id": "x", "events": [
        {"seq": 1, "type": "EXECUTION_STARTED", "payload": {}}]}))
    with pytest.raises(InvalidHistory, match="event 0 has seq 1"):
        replay(histories=[str(bad)])
    code, refused = loom_replay("--file", str(bad))
    assert code == 2 and refused["type"] == "InvalidHistory"
    code, refused = loom_replay("no-such-execution")
    assert code == 1 and refused["type"] == "UnknownExecution"


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                    max_leaves=12)
EVENT = st.fixed_dictionaries({"seq": st.integers(0, 3), "type": st.sampled_from(
    ["EXECUTION_STARTED", "STEP_STARTED", "STEP_COMPLETED", "STEP_FAILED", "WAIT_STARTED", "WAIT_WOKEN", "X"]),
    "payload": st.dictionaries(st.sampled_from(["flow", "input", "step", "pos", "attempt", "result", "$version"]),
                               JSON | st.just("ver.replayed"), max_size=5)})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(document=st.one_of(JSON, st.fixed_dictionaries({"format": st.just("loom-history/1"),
                                                       "execution_id": st.just("h-1"),
                                                       "events": st.lists(EVENT, min_size=1, max_size=4)})))
def test_any_document_is_a_history_or_invalid_history_and_a_replay_never_raises(document):
    before = rows()
    try:
        history = History.from_json(document, "doc")
    except InvalidHistory:
        assert rows() == before
        return
    result = replay_history(history)  # never raises: what it found is in the result
    assert result.ok in (True, False) and (result.ok or result.reason)
    assert rows() == before


def loom(*argv: str) -> tuple[int, object]:
    out = StringIO()
    try:
        call_command("loom", *argv, "--json", stdout=out, stderr=StringIO())
        code = 0
    except CommandError as exc:
        code = exc.returncode
    return code, json.loads(out.getvalue())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(execution_id=st.text(max_size=220), text=st.text(max_size=210))
def test_any_id_or_flow_text_given_to_export_replay_and_flows_gets_an_exit_code_and_writes_nothing(execution_id, text):
    """Every answer is done (0), refused (1) or a usage error (2), with a JSON document, never a traceback."""
    if execution_id.startswith("-"):
        execution_id = "x" + execution_id  # argparse would read it as an option
    before = rows()
    for argv in (("executions", "export", execution_id), ("replay", execution_id), ("replay", f"--flow={text}"),
                 ("flows", f"--flow={text}")):
        code, answer = loom(*argv)
        assert code in (0, 1, 2), (argv, code)
        assert code == 0 or (answer["ok"] is False and answer["error"]), (argv, answer)
    assert rows() == before
