"""The examples of docs/flows.md, "Flows that wait", run as they are written, in order, as one session.

Each example follows a `<!-- example: waits-... -->` marker; all of them must run (a missing primitive,
a changed name or a wrong result in the docs fails here). They run on the database under test, with
the settings a user has by default.
"""

from __future__ import annotations

import re

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.django_db(transaction=True)

DOC = ROOT / "docs" / "flows.md"
EXPECTED = ["waits-setup", "waits-sleep", "waits-start-at", "waits-messages", "waits-events", "waits-suspend",
            "waits-children", "waits-continue", "waits-deadline", "waits-fork"]


def examples() -> list[tuple[str, str]]:
    text = DOC.read_text()
    return re.findall(r"<!-- example: (waits-[\w-]+) -->\n```python\n(.*?)```", text, flags=re.S)


def test_every_primitive_has_an_example_in_the_docs():
    assert [name for name, _ in examples()] == EXPECTED


def test_the_examples_run_as_written():
    from journal.flows import ownership

    installed = ownership.get_ownership()
    ownership.set_ownership(None)  # no lease keeper thread in the test process
    session: dict = {"__name__": "docs_flows_waits"}
    try:
        for name, code in examples():
            try:
                exec(compile(code, f"docs/flows.md [{name}]", "exec"), session)
            except Exception as exc:
                raise AssertionError(f"the example {name} of docs/flows.md fails: {type(exc).__name__}: {exc}") from exc
    finally:
        ownership.set_ownership(installed)
