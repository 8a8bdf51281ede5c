"""Idempotent operations decide by identity before state (issue #35): a send of a message id already used
returns the id and writes nothing even once the recipient settled (docs/flows.md); before, it raised
ExecutionFinished, so a plain send step re-run after a crash failed its flow. SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from journal.flows import flow, ownership, resume, send, start, wake_due
from journal.flows.errors import ExecutionFinished
from journal.models import Event, Execution, Message
from tests.fixtures.flows_fixtures import Crash

pytestmark = pytest.mark.django_db

CRASH = {"after_send": False}


@flow("idem.receiver")
def receiver(ctx, value):
    return ctx.recv("go")


@flow("idem.sender")
def sender(ctx, value):
    """A plain (not atomic) step that sends with a fixed message id; it may die after its send committed."""
    def deliver() -> str:
        message_id = send(value["to"], "go", {"from": ctx.execution_id}, message_id=f"{ctx.execution_id}:go")
        if CRASH["after_send"]:
            raise Crash("died between the send's commit and the step's record")
        return message_id

    return ctx.step("deliver", deliver)


@pytest.fixture(autouse=True)
def _settings(settings):
    settings.LOOM_WAIT_INLINE_MAX = 0.0
    CRASH["after_send"] = False
    installed = ownership.get_ownership()
    ownership.set_ownership(None)
    yield
    ownership.set_ownership(installed)


def rows() -> tuple[int, int, int]:
    return Event.objects.count(), Message.objects.count(), Execution.objects.count()


@pytest.mark.parametrize("settle", ["completed", "cancelled"])
def test_a_resend_of_a_used_message_id_returns_it_after_the_recipient_settled(settle):
    assert start("idem.receiver", {}, execution_id="r-1").status == "waiting"
    assert send("r-1", "go", {"n": 1}, message_id="m-1") == "m-1"
    if settle == "completed":
        wake_due()
        assert Execution.objects.get(pk="r-1").status == "completed"
    else:
        from journal.flows import cancel

        cancel("r-1")
    before = rows()
    assert send("r-1", "go", {"n": 1}, message_id="m-1") == "m-1"  # the same send: its id, nothing written
    assert rows() == before
    with pytest.raises(ExecutionFinished):  # a new id to a settled recipient is still refused
        send("r-1", "go", {"n": 2}, message_id="m-2")
    assert rows() == before


def test_a_send_step_re_run_after_a_crash_completes_once_the_recipient_finished():
    assert start("idem.receiver", {}, execution_id="r-2").status == "waiting"
    CRASH["after_send"] = True
    with pytest.raises(Crash):
        start("idem.sender", {"to": "r-2"}, execution_id="s-2")
    CRASH["after_send"] = False
    wake_due()  # the recipient consumes the message and completes before the sender is recovered
    assert Execution.objects.get(pk="r-2").status == "completed"
    outcome = resume("s-2", force=True)  # the step runs again: its send is the same send
    assert (outcome.status, outcome.result) == ("completed", "s-2:go"), outcome
    assert Message.objects.filter(execution_id="r-2").count() == 1
