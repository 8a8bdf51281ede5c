"""The STEP_FAILED fields an exception names (`journal_error`, `journal_fields`; journal/flows/context.py), which
the Tasks backend uses for each attempt's class path, traceback and worker: recorded as str fields the payload
does not already have, and in a flow holding marked data, the marked values cut out of them as out of any error."""

from __future__ import annotations

import json

import pytest

from journal.flows import describe, flow, start
from journal.models import Event
from journal.privacy import keys
from tests.fixtures import privacy_fixtures as fx

pytestmark = pytest.mark.django_db


class Detailed(Exception):
    def __init__(self, text: str) -> None:
        super().__init__("plain")
        self.journal_error = f"custom: {text}"
        self.journal_fields = {"traceback": f"line 1\nline 2 {text}", "step": "not-overwritten", "n": 3}


def _raise(text: str):
    raise Detailed(text)


@flow("test.failure_fields.plain")
def plain(ctx, value):
    return ctx.step("detail", _raise, value["text"])


@flow("test.failure_fields.marked", input_model=fx.Signup)
def marked(ctx, value: fx.Signup):
    return ctx.step("detail", _raise, value.email)


def failed_payload(execution_id: str) -> dict:
    (payload,) = [e.payload for e in Event.objects.read(execution_id) if e.type == "STEP_FAILED"]
    return payload


def test_an_exceptions_error_text_and_str_fields_are_recorded_without_overwriting_the_payload():
    assert start("test.failure_fields.plain", {"text": "boom"}, execution_id="ff-1").status == "failed"
    payload = failed_payload("ff-1")
    assert payload["error"] == "custom: boom" and payload["traceback"] == "line 1\nline 2 boom"
    assert payload["step"] == "detail" and "n" not in payload  # not a str: left out
    assert describe("ff-1")["steps"][0]["traceback"] == "line 1\nline 2 boom"


def test_in_a_flow_with_marked_data_the_fields_hold_no_marked_value(settings, tmp_path):
    settings.LOOM_KEYS = [fx.KEY_A]
    settings.LOOM_CONTENT_DIR = str(tmp_path / "content")
    keys.cache.clear()
    try:
        outcome = start("test.failure_fields.marked", {"customer_id": "c-ff", "email": "ff@example.org"},
                        execution_id="ff-2")
        assert outcome.status == "failed"
        shown = json.dumps(failed_payload("ff-2"))
        assert "ff@example.org" not in shown and "line 2 <redacted>" in shown
    finally:
        keys.cache.clear()
