"""System check ids: one `loom.` namespace for the reusable apps, a range of numbers per app, every id in the
table of docs/configuration.md, and a renamed id's former name still honoured when a project silences it, with
loom.W002 saying which id to name instead (issue 32)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from django.core.checks import Error, run_checks

from journal import checks
from loomapi.checks import check_api_auth, check_api_tokens

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "configuration.md"
RANGES = {"journal": range(1, 100), "leases": range(100, 200), "loomapi": range(200, 300),
          "queues": range(300, 400), "projections": range(400, 500), "benchmarks": range(500, 600)}


def ids_in_code() -> dict[str, str]:
    """Every literal `id=` of a check message in the apps' and the demo site's code: id -> app."""
    found = {}
    for app in (*RANGES, "loomsite"):
        for path in sorted((ROOT / app).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call):
                    for keyword in node.keywords:
                        value = keyword.value
                        if (keyword.arg == "id" and isinstance(value, ast.Constant) and isinstance(value.value, str)
                                and re.fullmatch(r"[a-z]+\.[CEWID]\d{3}", value.value)):
                            found[value.value] = app
    return found


def documented() -> dict[str, tuple[str, tuple[str, ...]]]:
    """The table of docs/configuration.md "System checks": id -> (app, former ids)."""
    section = DOC.read_text(encoding="utf-8").split("## System checks", 1)[1]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 4:
            rows[cells[0].strip("`")] = (cells[1].split(" ")[0], tuple(re.findall(r"`([^`]+)`", cells[3])))
    return rows


def test_the_reusable_apps_ids_are_loom_ids_in_their_apps_range():
    found = ids_in_code()
    assert len(found) > 25, "the walk found few ids: is it broken?"
    wrong = sorted(f"{check_id} ({app})" for check_id, app in found.items() if app != "loomsite"
                   and not (check_id.startswith("loom.") and int(check_id[-3:]) in RANGES[app]))
    assert wrong == []
    assert all(check_id.startswith("loomsite.") for check_id, app in found.items() if app == "loomsite")


def test_the_docs_table_lists_every_id_with_its_app_and_former_ids():
    rows = documented()
    assert {check_id: app for check_id, (app, _) in rows.items()} == ids_in_code()
    assert {check_id: former for check_id, (_, former) in rows.items() if former} == checks.FORMER_IDS


def test_no_former_id_is_a_current_one():
    former = [old for olds in checks.FORMER_IDS.values() for old in olds]
    assert len(former) == len(set(former))
    assert set(former).isdisjoint(ids_in_code())


@pytest.mark.django_db
@pytest.mark.parametrize(("former", "current"), [("loomapi.E001", "loom.E201"), ("loom.E201", "loom.E201")])
def test_silencing_the_former_or_the_current_id_of_an_error_silences_it(settings, former, current):
    settings.LOOM_API_TOKENS = [{"name": "no-token-here"}]  # unreadable: the error
    assert [e.id for e in check_api_tokens()] == ["loom.E201"]
    settings.SILENCED_SYSTEM_CHECKS = [former]
    assert [e.id for e in run_checks() if e.id == current and not e.is_silenced()] == []  # as manage.py shows


@pytest.mark.django_db
def test_a_silenced_former_id_is_honoured_and_loom_w002_names_the_new_one(settings):
    settings.LOOM_API_AUTH = False
    assert [w.id for w in check_api_auth()] == ["loom.W202"]
    settings.SILENCED_SYSTEM_CHECKS = ["loomapi.W002", "some.W999"]
    assert check_api_auth() == []
    told = [m for m in run_checks(include_deployment_checks=True)
            if m.id in {"loom.W202", "loom.W002"} and not m.is_silenced()]
    assert [m.id for m in told] == ["loom.W002"]
    assert "'loomapi.W002'" in told[0].msg and "'loom.W202'" in told[0].hint


def test_naming_the_new_id_ends_the_reminder(settings):
    settings.SILENCED_SYSTEM_CHECKS = ["loomapi.W002", "loom.W202"]
    assert checks.check_former_ids_silenced() == []
    settings.SILENCED_SYSTEM_CHECKS = []
    assert checks.check_former_ids_silenced() == []


def test_the_queues_backends_former_id_is_honoured(settings):
    """The Tasks backend's check is not a registered function: its messages go through honour_former_ids."""
    error = Error("needs the queues app", id="loom.E301")
    assert checks.honour_former_ids([error]) == [error]
    settings.SILENCED_SYSTEM_CHECKS = ["loom.E130"]
    assert checks.honour_former_ids([error]) == []
    assert [w.id for w in checks.check_former_ids_silenced()] == ["loom.W002"]
