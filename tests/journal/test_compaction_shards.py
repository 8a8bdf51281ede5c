"""Compaction and re-snapshot under LOOM_SHARDS (docs/retention.md "Compaction", "Shards"): each shard's streams are
compacted on that shard only, its batches recorded where the stream lives, one compactor per shard (the advisory
lock is each shard's own); a shard that does not answer is named (exit 4) and the others are still compacted, by
the CLI and by a worker's retention service; re-snapshot acts on each stream's shard.

On two real PostgreSQL servers (5432 and the `shard1` cluster on 5433, scripts/shard-servers; run under
`flock /tmp/loom-shards.lock`), and on two SQLite files: the code does not restrict shards to PostgreSQL (any
DATABASES aliases; docs/scaling.md describes PostgreSQL servers), so the same scenario runs on both, SQLite's
compactor lock being the database's write lock. Each scenario runs in a child process configured for its shards
(tests/journal/compaction_scenarios.py); the databases are this module's own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARD1 = os.environ.get("LOOM_TEST_SHARD1", "127.0.0.1:5433")
NOWHERE = "postgres://postgres@127.0.0.1:5439/nothing"  # no listener: a shard whose server does not answer


def _env(default_url: str, shard1_url: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "DATABASE_URL": default_url,
        "SHARD_DATABASE_URLS": f"shard1={shard1_url}",
        "LOOM_SHARDS": "default,shard1",
        "DJANGO_SETTINGS_MODULE": "loomsite.settings",
        "PYTHONPATH": str(ROOT),
        "SECRET_KEY": "compaction-shard-tests-" + "k" * 40,
        "LOOM_LEASE_MODE": "off",
    })
    env.pop("POOLER_PORTS", None)
    for alias in ("default", "shard1"):
        subprocess.run([sys.executable, "manage.py", "migrate", "--database", alias, "--noinput", "-v0"], env=env,
                       cwd=ROOT, check=True)
    return env


@pytest.fixture(scope="module")
def pg_shards() -> dict[str, str]:
    from tests.journal.test_shards import linguistic, listening, psql

    if not listening(SHARD1):
        pytest.skip(f"no shard server on {SHARD1}: scripts/shard-servers starts it (CI does)")
    from benchmarks.children import database_url

    base = urlsplit(database_url())
    if not base.scheme.startswith("postgres"):
        pytest.skip("needs PostgreSQL (run with DATABASE_URL=postgres://...)")
    main = f"{base.hostname}:{base.port or 5432}"
    name = f"{base.path.lstrip('/')}_cs".replace("-", "_")
    for server, db in ((main, f"{name}0"), (SHARD1, f"{name}1")):
        psql(server, f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        psql(server, f"CREATE DATABASE {db}{linguistic(server)}")
    return _env(f"postgres://postgres@{main}/{name}0", f"postgres://postgres@{SHARD1}/{name}1")


@pytest.fixture(scope="module")
def sqlite_shards(tmp_path_factory) -> dict[str, str]:
    where = tmp_path_factory.mktemp("compaction-shards")
    return _env(f"sqlite:///{where / 's0.sqlite3'}", f"sqlite:///{where / 's1.sqlite3'}")


def scenario(env: dict, name: str, arg: dict | None = None, **overrides: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "tests.journal.compaction_scenarios", name, json.dumps(arg or {})],
                          env={**env, **overrides}, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check_on_shards(facts: dict, postgres: bool) -> None:
    before, after = facts["before"], facts["after"]
    assert {f["shard"] for f in before.values()} == {"default", "shard1"}
    for stream, f in after.items():
        assert f["seqs"] == [9, 10, 11], (stream, f)  # compacted before its newest snapshot (seq 9), on its shard
        assert f["snapshots"] == [9] and f["batches"] == 9 and f["elsewhere"] == [], (stream, f)
        assert f["state"] == before[stream]["state"] == [12, 12, 11]  # a load after it equals the load before
    if postgres:  # shard1's compactor lock held by another session: default's streams compacted, shard1's not
        assert facts["while_locked"]["default"]["streams"] == 2 and facts["while_locked"]["shard1"]["streams"] == 0
        locked = facts["after_locked"]
        assert all(f["seqs"][0] == (9 if f["shard"] == "default" else 0) for f in locked.values()), locked
        assert facts["cli"][0] == 0 and facts["cli"][1]["shard1"]["streams"] == 2
        assert facts["cli"][1]["default"]["streams"] == 0
    else:
        assert facts["cli"][0] == 0 and [facts["cli"][1][a]["streams"] for a in ("default", "shard1")] == [2, 2]
    assert facts["status"] == {alias: sorted(s for s, f in after.items() if f["shard"] == alias)
                               for alias in ("default", "shard1")}  # `retention status` reads each shard's batches
    assert facts["admin"] == [200, True]  # the aggregate admin page of a shard1 stream, on shard1

    code, doc = facts["resnapshot_fresh"]
    assert code == 0 and doc["resnapshotted"] == 2, doc
    assert sorted(s["alias"] for s in doc["streams"]) == ["default", "shard1"]
    for stream, f in facts["fresh"].items():
        assert f["elsewhere"] == [] and f["state"] == [7, 7, 6]
        assert facts["fresh_snapshots"][stream][-1] == [6, {"n": 7, "bumps": 7}]  # written on its own shard
    code, doc = facts["resnapshot_compacted"]
    assert code == 1 and doc["type"] == "CompactedStream" and "cannot refold it" in doc["error"]
    assert [(s["alias"], s["action"]) for s in doc["results"]["streams"]] == [("shard1", "refused")]


@pytest.mark.postgres
def test_compaction_on_two_postgresql_shards_stays_on_each_streams_shard_with_a_lock_per_shard(pg_shards):
    check_on_shards(scenario(pg_shards, "on_shards", {"run": "os"}), postgres=True)


def test_compaction_on_two_sqlite_shards_stays_on_each_streams_shard(sqlite_shards):
    check_on_shards(scenario(sqlite_shards, "on_shards", {"run": "os"}), postgres=False)


@pytest.mark.postgres
def test_a_shard_that_does_not_answer_is_named_and_the_others_are_still_compacted_and_resnapshotted(pg_shards):
    facts = scenario(pg_shards, "shard_down", {"run": "sd"}, LOOM_SHARDS="default,shard1,shard2",
                     SHARD_DATABASE_URLS=f"{pg_shards['SHARD_DATABASE_URLS']};shard2={NOWHERE}")
    assert facts["down"] == "shard2"
    code, doc = facts["cli"]
    assert code == 4 and doc["type"] == "DatabaseUnavailable" and "shard2" in doc["error"], doc
    assert doc["results"]["unreachable"] == ["shard2"]
    assert doc["results"]["default"]["streams"] >= 1 and doc["results"]["shard1"]["streams"] >= 1  # (and the
    # streams the module's first scenario re-snapshotted: compactable since)
    assert all(f["seqs"] == [9, 10, 11] for f in facts["after_cli"].values()), facts["after_cli"]
    code, doc = facts["status"]  # `retention status` and `run` too: the reached shards' answers, shard2 named
    assert code == 4 and doc["results"]["unreachable"] == ["shard2"], doc
    assert [one["alias"] for one in doc["results"]["shards"]] == ["default", "shard1"]
    assert all(one["compaction"]["compacted"] for one in doc["results"]["shards"])
    code, doc = facts["run"]
    assert code == 4 and doc["results"]["unreachable"] == ["shard2"] and set(doc["results"]) == {
        "default", "shard1", "unreachable"}, doc
    code, doc = facts["resnapshot"]
    assert code == 4 and doc["results"]["unreachable"] == ["shard2"] and doc["results"]["resnapshotted"] == 2, doc
    assert all(f["seqs"] == [9, 10, 11] and f["state"] == [12, 12, 11] for f in facts["service"].values()), \
        facts["service"]  # the worker's service compacted both reachable shards while shard2 was down
    assert facts["service_stopped"]
