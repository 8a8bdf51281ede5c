"""Retention's readers under LOOM_SHARDS (docs/retention.md "Shards", docs/scaling.md): the aggregate admin's stream
list reads every shard (merged in one order, paged over all, each row naming its shard, a shard that does not
answer named while the others are listed; a shard1 row opens in a real browser); restore checks the committed
batch on the shard the executions were removed from and restores them there; `loom archive list` marks each
archive committed or not, on every shard.

On two real PostgreSQL servers (5432 and the `shard1` cluster on 5433, scripts/shard-servers; run under
`flock /tmp/loom-shards.lock`) and on two SQLite files, each scenario in a child process configured for its shards
(tests/journal/retention_shard_scenarios.py); the databases are this module's own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.journal.test_compaction_shards import NOWHERE, SHARD1, _env

ROOT = Path(__file__).resolve().parents[2]
FLOWS = {"LOOM_FLOW_MODULES": "tests.fixtures.shard_fixtures"}


@pytest.fixture(scope="module")
def pg_shards() -> dict[str, str]:
    from benchmarks.children import database_url
    from tests.journal.test_shards import linguistic, listening, psql

    if not listening(SHARD1):
        pytest.skip(f"no shard server on {SHARD1}: scripts/shard-servers starts it (CI does)")
    base = urlsplit(database_url())
    if not base.scheme.startswith("postgres"):
        pytest.skip("needs PostgreSQL (run with DATABASE_URL=postgres://...)")
    main = f"{base.hostname}:{base.port or 5432}"
    name = f"{base.path.lstrip('/')}_rs".replace("-", "_")
    for server, db in ((main, f"{name}0"), (SHARD1, f"{name}1")):
        psql(server, f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        psql(server, f"CREATE DATABASE {db}{linguistic(server)}")  # a linguistic collation: the merge's order
    return {**_env(f"postgres://postgres@{main}/{name}0", f"postgres://postgres@{SHARD1}/{name}1"), **FLOWS}


@pytest.fixture(scope="module")
def sqlite_shards(tmp_path_factory) -> dict[str, str]:
    where = tmp_path_factory.mktemp("retention-shards")
    return {**_env(f"sqlite:///{where / 's0.sqlite3'}", f"sqlite:///{where / 's1.sqlite3'}"), **FLOWS}


def scenario(env: dict, name: str, arg: dict | None = None, **overrides: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "tests.journal.retention_shard_scenarios", name,
                           json.dumps(arg or {})], env={**env, **overrides}, cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check_list(facts: dict) -> None:
    per_page, expected = facts["per_page"], facts["expected"]
    assert facts["aliases"] == ["default", "shard1"]
    assert len(expected) == 72 and set(facts["statuses"]) == {200}
    assert facts["pages"] == [per_page, len(expected) - per_page]  # paged over both shards' streams together
    assert facts["counts"] == [len(expected)] * 2  # the count is both shards'
    # every stream once, in stream-id order over both shards, each named with the shard it lives on
    assert sorted(facts["listed"]) == expected
    assert [row[1] for row in facts["listed"]] == facts["expected_order"]
    assert facts["search"] == facts["search_expected"] and facts["search_count"] == 24  # a search reads both shards
    assert {alias for _, alias in facts["search"]} == {"default", "shard1"}
    assert facts["down"] == [[], []]
    assert facts["detail"] == [200, True, True], facts["detail"]  # a shard1 row's link opens that stream
    clicked = facts["clicked"]
    if Path("/usr/bin/chromium").exists():
        assert clicked is not None, "Chromium is installed but Playwright did not drive it"
        assert clicked["rows_on_list"] == per_page
        assert clicked["url"].endswith(f"/admin/journal/aggregatestream/ListTally/{facts['clicked_id']}/"), clicked
        assert clicked["heading"].startswith("Current state at version"), clicked
        assert clicked["events"] >= 1 and '"n"' in clicked["state"], clicked


@pytest.mark.postgres
def test_the_aggregate_stream_list_reads_every_postgresql_shard_merged_paged_and_opens_a_shard1_stream(pg_shards):
    """Two servers whose databases sort text linguistically: the list still pages in one byte-wise order."""
    check_list(scenario(pg_shards, "aggregate_list", {"run": "al", "browser": True}))


def test_the_aggregate_stream_list_reads_both_sqlite_shards_merged_paged_and_opens_a_shard1_stream(sqlite_shards):
    check_list(scenario(sqlite_shards, "aggregate_list", {"run": "al", "browser": True}))


def check_restore(facts: dict) -> None:
    eid, name, second = facts["eid"], facts["name"], facts["second"]
    gone = {"default": [0, 0], second: [0, 0]}
    assert facts["removed"] == 1 and facts["after_removal"] == gone
    assert f"/{second}/" in name  # the object of shard1's batch
    code, listed = facts["list_uncommitted"]
    assert code == 0 and listed == [{"name": name, "alias": second, "committed": False}], listed
    code, doc = facts["refused"]  # a row naming it on default does not count: its batch ran on shard1
    assert code == 1 and doc["type"] == "ArchiveError", doc
    assert f"names no committed removal batch on {second}" in doc["error"], doc
    assert facts["after_refused"] == gone
    code, listed = facts["list_committed"]
    assert code == 0 and listed == [{"name": name, "alias": second, "committed": True}], listed
    code, doc = facts["elsewhere"]
    assert code == 1 and doc["type"] == "ArchiveError" and f"removed from shard {second}" in doc["error"], doc
    assert facts["after_elsewhere"] == gone  # nothing written on default (nor on shard1)
    code, restored = facts["restored"]
    assert code == 0 and restored == [eid], restored
    assert facts["after_restore"]["default"] == [0, 0] and facts["after_restore"][second][0] == 1
    assert facts["after_restore"][second][1] >= 2 and facts["reads_as_it_did"]


@pytest.mark.postgres
def test_restore_checks_the_committed_batch_on_the_postgresql_shard_it_was_removed_from(pg_shards, tmp_path):
    check_restore(scenario(pg_shards, "restore_checks_its_shard", {"run": "rc", "archives": str(tmp_path)}))


def test_restore_checks_the_committed_batch_on_the_sqlite_shard_it_was_removed_from(sqlite_shards, tmp_path):
    check_restore(scenario(sqlite_shards, "restore_checks_its_shard", {"run": "rc", "archives": str(tmp_path)}))


@pytest.mark.postgres
def test_a_shard_that_does_not_answer_is_named_by_the_stream_list_and_the_archive_list(pg_shards, tmp_path):
    facts = scenario(pg_shards, "shard_down", {"run": "sd", "archives": str(tmp_path)},
                     LOOM_SHARDS="default,shard1,shard2",
                     SHARD_DATABASE_URLS=f"{pg_shards['SHARD_DATABASE_URLS']};shard2={NOWHERE}")
    assert facts["down"] == "shard2"
    status, down, rows, count = facts["page"]
    assert status == 200 and down == ["shard2"] and rows == facts["expected"] and count == 2, facts["page"]
    code, doc, _ = facts["list"]
    assert code == 4 and doc["type"] == "DatabaseUnavailable" and doc["results"]["unreachable"] == ["shard2"], doc
    marks = {a["alias"]: a["committed"] for a in doc["results"]["archives"]}
    assert marks == {"shard1": True, "shard2": None}, doc
    assert facts["removed"] >= 1  # (and the module's restored execution of the restore test, old: removed again)
