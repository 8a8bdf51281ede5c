"""The README's full aggregate example runs as written (in a fresh process, on the test database)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_child

README = Path(__file__).resolve().parent.parent / "README.md"


def python_block_after(heading: str) -> str:
    text = README.read_text()
    start = text.index("```python", text.index(heading)) + len("```python")
    return text[start:text.index("```", start)]


@pytest.mark.django_db(transaction=True)
def test_readme_aggregate_example_runs(child_env):
    code = python_block_after("## Event-sourced aggregates") + (
        "\nfinal = load(ticket, '42', fresh=True)\n"
        "assert (final.state.status, final.state.assignee, final.version) == ('closed', 'carol', 3), final\n"
        "print('readme-ok')\n"
    )
    assert "readme-ok" in run_child(code, child_env).stdout
