"""Async flows across features: sealed fields and forget (journal/privacy) write and read the same as a sync flow's;
flow versions (an async execution resumes on the version it started on, wherever it is woken).
SQLite and PostgreSQL.
(Queued starts and tasks from async views, forget included: tests/queues/test_queues_async.py.)"""

from __future__ import annotations

import json

import pytest

from journal.flows import describe, send, start, wake_due
from journal.models import Event, Execution
from journal.privacy.codec import FORGOTTEN
from tests.fixtures import mode_flows as mf  # noqa: F401 (registers the flows)
from tests.fixtures import privacy_fixtures as pf
from tests.flows.test_flow_versions import release
from tests.privacy.test_privacy import raw_rows

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _flows(settings, tmp_path):
    settings.LOOM_FLOW_MODULES = ["tests.fixtures.mode_flows", "tests.fixtures.privacy_fixtures"]
    settings.LOOM_WAIT_INLINE_MAX = 0.0
    with pf.keyed_without_keeper(settings, tmp_path):
        yield


def test_an_async_flow_seals_its_marked_input_and_step_result_and_forget_withholds_them():
    from journal.privacy import forget

    out = start("test.privacy.asignup", {"customer_id": "ac-1", "email": "async@example.org"}, execution_id="apx-1")
    assert out.status == "completed" and out.result == {"greeted": True}
    assert "async@example.org" not in raw_rows()  # sealed in the input and in the coroutine step's result
    info = describe("apx-1")
    assert info["input"]["email"] == "async@example.org"
    assert info["steps"][0]["result"]["text"] == "hi async@example.org"
    forget("ac-1", by="dpo@example.org")
    info = describe("apx-1")
    assert info["input"]["email"] == FORGOTTEN and info["steps"][0]["result"]["text"] == FORGOTTEN
    assert "async@example.org" not in json.dumps(info, default=str)


def test_an_async_execution_resumes_on_the_version_it_started_on():
    with release("modes.async.versioned", 1):  # before version 2 was deployed
        old = start("modes.async.versioned", {}, execution_id="av-1")
    new = start("modes.async.versioned", {}, execution_id="av-2")
    assert (old.status, new.status) == ("waiting", "waiting")
    assert Execution.objects.get(pk="av-1").flow_version == 1 and Execution.objects.get(pk="av-2").flow_version == 2
    send("av-1", "go", "a")
    send("av-2", "go", "b")
    wake_due()
    assert Execution.objects.get(pk="av-1").result == {"version": 1, "got": "a"}
    assert Execution.objects.get(pk="av-2").result == {"version": 2, "got": "b"}
    assert next(e.payload.get("step") for e in Event.objects.read("av-1") if e.type == "STEP_COMPLETED") == "v1-only"
