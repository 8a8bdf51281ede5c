"""The layout rule of issue 14: one owner per table.

Outside tests, migrations and docs, a table's name (so its SQL) appears only under the app that owns
it: `journal_*` under journal/, `leases_*` under leases/, `projections_*` under projections/. Another
app reaches those tables through the owner's store methods or its named hooks (docs/architecture.md,
"How the parts fit"). Admin URL names such as "admin:journal_execution_change" are not table names
(the word boundary stops at `_change`), and `reverse(...)` lines are skipped besides.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from django.apps import apps

ROOT = Path(__file__).resolve().parent.parent
OWNERS = ("journal", "leases", "projections", "queues")


def _tables() -> dict[str, str]:
    """Every table of the owning apps' models, with the app its name says owns it."""
    tables = {}
    for label in OWNERS:
        for model in apps.get_app_config(label).get_models():
            owner = model._meta.db_table.split("_", 1)[0]
            if owner in OWNERS:
                tables[model._meta.db_table] = owner
    return tables


def _grep(pattern: str) -> list[str]:
    result = subprocess.run(
        ["git", "grep", "--untracked", "-nwE", pattern, "--", ".", ":!tests", ":!*/migrations/*", ":!docs", ":!*.md"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )
    assert result.returncode in (0, 1), result.stderr
    return result.stdout.splitlines()


def violations(lines: list[str], tables: dict[str, str]) -> list[str]:
    """The grep lines that name a table outside its owner's folder (reverse() URL lines excepted)."""
    found = []
    for line in lines:
        path, _, text = line.partition(":")
        if "reverse(" in text:
            continue
        for table in re.findall(r"\b(" + "|".join(map(re.escape, tables)) + r")\b", text):
            if not path.startswith(tables[table] + "/"):
                found.append(line)
                break
    return found


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout")
def test_every_table_is_named_only_under_its_owning_app():
    """A statement on journal_*, leases_* or projections_* tables lives in that app (its store);
    others call the store. The grep of the issue's done-when check, kept true."""
    tables = _tables()
    assert {"journal_event", "journal_fence", "leases_lease", "projections_subscription"} <= set(tables)
    lines = _grep("|".join(map(re.escape, tables)))
    assert any(line.startswith("journal/store/") for line in lines), "the grep found nothing: is it broken?"
    assert violations(lines, tables) == []


def test_the_layout_check_catches_a_table_named_outside_its_app():
    """The rule itself: a bench's raw SQL on journal_event is a violation; the owner's SQL and an
    admin URL name are not."""
    tables = {"journal_event": "journal", "leases_lease": "leases"}
    lines = [
        'benchmarks/streams.py:14:        cursor.execute("SELECT count(*) FROM journal_event")',
        'journal/store/base.py:9:COUNT_EVENTS = "SELECT count(*) FROM journal_event"',
        'leases/admin.py:58:            url = reverse("admin:journal_event_change", args=[1])',
        'projections/store/postgres.py:3:    DELETE FROM leases_lease',
    ]
    assert violations(lines, tables) == [lines[0], lines[3]]
