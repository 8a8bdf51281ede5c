"""Shards on two real PostgreSQL servers (5432 and the `shard1` cluster on 5433) and PgBouncer (6432).

CI starts them (`scripts/shard-servers`, called by .ci/run); without them every test here skips with one
line. Each scenario runs in a child process configured for two shards (tests/fixtures/shard_scenarios.py), so the
suite's own database settings stay untouched; the databases are this run's own (`<suite db>_s0` on 5432,
`<suite db>_s1` on 5433), created and migrated once per module.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from benchmarks.faults.processes import database_url
from benchmarks.sections.shards import release_pooled

ROOT = Path(__file__).resolve().parents[2]
SHARD1 = os.environ.get("LOOM_TEST_SHARD1", "127.0.0.1:5433")
BOUNCER = os.environ.get("LOOM_TEST_BOUNCER", "127.0.0.1:6432")
CLUSTER = os.environ.get("LOOM_TEST_SHARD1_CLUSTER", "15/shard1")  # pg_ctlcluster's version/name

pytestmark = pytest.mark.postgres


def listening(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


def psql(server: str, sql: str) -> str:
    return subprocess.run(["psql", f"postgres://postgres@{server}/postgres", "-qtAc", sql], check=True,
                          capture_output=True, text=True).stdout.strip()


def linguistic(server: str) -> str:
    """CREATE DATABASE's locale clause: the server's default when it is a linguistic collation (production's
    usual), else ICU en-US, so that text orders as a production server orders it (a before B, "C" puts B
    first) and the admin's merge over shards is tested against it."""
    if psql(server, "SHOW lc_collate").split(".")[0] not in ("C", "POSIX"):
        return ""
    return " TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US'"


@pytest.fixture(scope="module")
def shard_env(tmp_path_factory) -> dict[str, str]:
    if not listening(SHARD1):
        pytest.skip(f"no shard server on {SHARD1}: scripts/shard-servers starts it (CI does)")
    base = urlsplit(database_url())
    main = f"{base.hostname}:{base.port or 5432}"
    name = f"{base.path.lstrip('/')}_s".replace("-", "_")
    for server, db in ((main, f"{name}0"), (SHARD1, f"{name}1")):
        psql(server, f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        psql(server, f"CREATE DATABASE {db}{linguistic(server)}")
    env = dict(os.environ)
    env.update({
        "DATABASE_URL": f"postgres://postgres@{main}/{name}0",
        "SHARD_DATABASE_URLS": f"shard1=postgres://postgres@{SHARD1}/{name}1",
        "LOOM_SHARDS": "default,shard1",
        "DJANGO_SETTINGS_MODULE": "loomsite.settings",
        "PYTHONPATH": str(ROOT),
        "SECRET_KEY": "shard-tests-" + "k" * 40,
        "LOOM_FLOW_MODULES": "tests.fixtures.shard_fixtures",
        "LOOM_PROJECTION_MODULES": "tests.fixtures.shard_fixtures",
        "LOOM_LEASE_MODE": "eager",
        "LOOM_LEASE_TTL": "2",
        "LOOM_LEASE_RENEW_EVERY": "0.5",
        "LOOM_RECOVERY_EVERY": "0.3",
        "LOOM_DRAIN_POLL_MS": "100",
    })
    env.pop("POOLER_PORTS", None)
    for alias in ("default", "shard1"):
        subprocess.run([sys.executable, "manage.py", "migrate", "--database", alias, "--noinput", "-v0"], env=env,
                       cwd=ROOT, check=True)
    scenario(env, "setup")
    return env


def scenario(env: dict, name: str, arg: dict | None = None, **overrides: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "tests.fixtures.shard_scenarios", name, json.dumps(arg or {})],
                          env={**env, **overrides}, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def spawn(env: dict, args: list[str], log: Path) -> subprocess.Popen:
    """A child in its own session; its logs go to a file (a pipe nobody reads would fill and block it while a
    shard is down and every retry logs)."""
    with open(log, "a") as err:
        return subprocess.Popen([sys.executable, *args], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=err,
                                text=True, start_new_session=True)


def wait_status(env: dict, eids: list[str], timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        facts = scenario(env, "status", {"eids": eids})
        if all(e["status"] == "completed" for e in facts["executions"].values()) or time.monotonic() > deadline:
            return facts
        time.sleep(0.5)


def stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_every_entry_point_writes_a_stream_on_the_shard_the_router_names_and_only_there(shard_env):
    facts = scenario(shard_env, "placement", {"run": "pl"})
    assert facts["wrong"] == []
    assert facts["spread"] == ["default", "shard1"]  # both shards are used
    assert facts["statements"] == {"default": 1, "shard1": 1}  # append_batch: one statement per shard
    assert facts["partly"]["bad_tip"] == 0  # the refused stream got nothing
    assert len(facts["partly"]["refused"]) == 1 and len(facts["partly"]["written"]) == 1
    assert facts["partly"]["good_tip"] == 1  # the other shard's part of the refused batch was written
    assert all(f == ["completed", True, True, "completed"] for f in facts["flows"])
    assert facts["aggregates"] == [5] * 12
    assert facts["invalid"] == []  # a bad payload in a batch over both shards: nothing written on either
    assert facts["coalescers"] == ["default", "shard1"]  # one coalescer per shard, each stream on its own


def test_a_declared_partition_key_keeps_a_tenants_streams_on_its_shard(shard_env):
    facts = scenario(shard_env, "tenants", {"run": "tn"}, LOOM_SHARD_KEY="journal.shards.prefix_key")
    assert all(places == [home] for places, home in facts.values())
    assert {home for _, home in facts.values()} == {"default", "shard1"}


def test_adding_a_shard_moves_nothing_and_places_only_new_streams_on_it(shard_env):
    before = scenario(shard_env, "grow", {"run": "gr", "phase": "before"}, LOOM_SHARDS="default")
    assert before["shards"] == ["default"] and all(w == ["default"] for w in before["where"].values())
    after = scenario(shard_env, "grow", {"run": "gr", "phase": "after"}, LOOM_SHARD_HISTORY="1")
    assert after["moved_placement"] > 0  # the new hash would place some old streams on shard1 ...
    assert after["found"] == after["old_where"] == ["default"]  # ... they are found, and stay, on default
    assert after["refused"] == 24 and after["again"] == "refused"  # no twin of an old id
    assert after["old_tips"] == [1]  # the appends after the change went to the old streams
    assert after["new_where"] == ["default", "shard1"] and after["new_right"]


def test_a_flow_an_aggregate_and_a_projection_work_across_two_shards(shard_env):
    facts = scenario(shard_env, "together", {"run": "tg"})
    assert set(facts["outcomes"].values()) == {"completed"}
    assert set(facts["flow_shards"].values()) == {"default", "shard1"}
    assert all(rows == {"s0": 1, "s1": 1, "s2": 1} for rows in facts["effects"].values())
    assert set(facts["states"].values()) == {3} and facts["agg_shards"] == ["default", "shard1"]
    # one read model fed by both shards' drains: every aggregate event seen exactly once
    assert len(facts["seen"]) == 4 and set(facts["seen"].values()) == {3}


def test_the_executions_admin_lists_every_shard_and_opens_each_execution_on_its_own(shard_env):
    facts = scenario(shard_env, "admin_pages", {"run": "adm"})
    assert sorted(facts["listed"]) == facts["expected"] and facts["distinct"] == 60  # two pages, both shards
    assert facts["count"] == "60"
    assert facts["page"] == 200 and facts["names_flow"] and facts["confirm"] == 200
    assert facts["lists"] and set(facts["lists"].values()) == {200}, facts["lists"]
    assert len(facts["fences"]) == 60  # the fences list (journal's generic read-only page) merges both shards too
    # a search by an input value (issue #28) finds the marked execution of each shard, in the admin and the CLI
    assert sorted(set(facts["marked_shards"])) == ["default", "shard1"]
    assert facts["searched"] == facts["marked"] and facts["searched_cli"] == facts["marked"]


def test_leases_workers_subscriptions_and_checkpoints_are_listed_opened_and_acted_on_per_shard(shard_env):
    """Ids repeat across shards (one worker id on each, the same subscription id): each list shows both shards'
    rows with their shard, a shard1 row's page reads shard1 (its worker's leases too), and the Unblock action
    clicked in a real browser on the shard1 row unblocks that row, not default's row with the same id."""
    facts = scenario(shard_env, "admin_rows_per_shard", {"run": "aps", "browser": True})
    both = ["default", "shard1"]
    assert facts["lease_shards"] == both
    lists = facts["lists"]
    assert {k: lists[k] for k in ("leases", "workers", "subscriptions")} == {
        "leases": ["default", "default", "shard1", "shard1"], "workers": both, "subscriptions": both}, lists
    assert sorted(set(lists["checkpoints"])) == both, lists  # (no search on checkpoints: every consumer's)
    assert [link.rsplit("=", 1)[1] for link in facts["links"]] == both  # each row's link names its shard
    pages = facts["pages"]
    assert pages["worker"] and not pages["worker_default"], pages  # shard1's worker row, not default's
    assert len(pages["worker_leases"]) == 2, pages  # the leases it holds on shard1 (its inline)
    assert pages["subscription"] == 200 and pages["sub_stream"] and not pages["sub_default"], pages
    assert pages["lease"] == 200 and pages["checkpoint"] == 200, pages
    assert facts["boxes"] == [f"{alias}:{900_003}" for alias in both]  # each checkbox names its row's shard
    if Path("/usr/bin/chromium").exists():  # the Unblock button was clicked in the browser (else a Client POST)
        assert "1 subscription(s) unblocked" in (facts["clicked"] or ""), facts["clicked"]
    assert facts["blocked"] == {"default": True, "shard1": False}


def test_a_sharded_list_pages_through_every_shards_rows_in_one_order_once_each(shard_env):
    """More subscriptions on shard1 than on default, ordered by consumer under a linguistic collation (review r1
    F1, F2, F3, F4, F5): every page opens (not only the default shard's own), lists each row once and "B-"
    before "a-" (byte order on every shard and in the merge), the default shard is counted once, a page past
    the depth cap says so, the action bar follows the merged rows, and History opens the row's own shard."""
    facts = scenario(shard_env, "admin_merged_list", {"run": "ml"})
    linguistic_order = [c[1] in ("i", "icu") or c[0].split(".")[0] not in ("C", "POSIX")
                        for c in facts["collations"].values()]
    assert all(linguistic_order), facts["collations"]  # where "a-" sorts before "B-"
    assert facts["pages"] == {str(n): [200, None] for n in (1, 2, 3, 4)}, facts["pages"]
    expected = ([f"ml-B-{i:03}" for i in range(110)] + [f"ml-a-{i:03}" for i in range(110)]
                + [f"ml-c-{i:03}" for i in range(120)])
    assert facts["listed"] == expected, [n for n in facts["listed"] if facts["listed"].count(n) > 1][:5]
    assert facts["count"] == "340"
    assert facts["default_counts"] == 1  # Django's own count and full count on default are not run as well
    assert facts["deep"] == [200, 0, True]  # past the cap: a message, no rows, not a whole shard read
    assert facts["only_rows"] == 100 and facts["only_actions"]  # rows on shard1 only: actions still offered
    assert facts["change_shows"] and "shard=shard1" in (facts["history_link"] or ""), facts["history_link"]
    assert facts["history_title"].startswith("Change history: ml-h-shard1"), facts["history_title"]


def test_an_unreachable_shard_leaves_every_list_listing_the_others_and_its_rows_pages_answer_503(shard_env):
    """A third shard whose server does not answer (its port has no listener; no server is stopped): the lists
    show default's and shard1's rows with an error naming it, never a 500; its rows' pages answer 503."""
    urls = f"{shard_env['SHARD_DATABASE_URLS']};shard2=postgres://postgres@127.0.0.1:5439/nothing"
    facts = scenario(shard_env, "admin_shard_down", {"run": "down"}, SHARD_DATABASE_URLS=urls,
                     LOOM_SHARDS="default,shard1,shard2")
    assert facts["down"] == "shard2"
    assert all(found == [200, None, True] for found in facts["lists"].values()), facts["lists"]
    assert facts["listed"] == ["down-d-on-default", "down-d-on-shard1"]
    assert all(found == [503, True] for found in facts["pages"].values()), facts["pages"]


def test_an_unreachable_shard_leaves_the_operations_page_the_search_and_the_api_list_answering(shard_env):
    """Issue 28's console with a shard down (its alias at a port where nothing listens; no server stopped): the
    operations page (both windows) and the executions search show the reachable shards' rows and name the down
    one, never a 500; the API's list answers 503 naming it, for a full-read token and a "read: own" one; the
metrics page reads every other shard and says which one it could not read."""
    urls = f"{shard_env['SHARD_DATABASE_URLS']};shard2=postgres://postgres@127.0.0.1:5439/nothing"
    facts = scenario(shard_env, "operations_shard_down", {"run": "opd"}, SHARD_DATABASE_URLS=urls,
                     LOOM_SHARDS="default,shard1,shard2")
    assert facts["down"] == "shard2"
    # pause and resume from the page: a message that a database could not be reached, not a 500
    assert facts["acted"] == {"pause_queue": [200, True], "resume_queue": [200, True]}, facts["acted"]
    assert len(facts["every"]) > 15 and set(facts["every"].values()) == {200}, facts["every"]  # every admin list
    # flow versions: the down shard's live executions are unknown, so no version is called safe to retire
    assert facts["retire"] == {"named": True, "safe": False, "unknown": True, "flow": True}, facts["retire"]
    pages = list(facts["pages"].values())
    assert all(status == 200 and named for status, named, _ in pages), facts["pages"]
    assert "opd-q" in pages[0][2] and "opd-q" in pages[1][2]  # the queue of the pending entry on shard1
    assert pages[2][2] == facts["marked"] and pages[3][2] == [facts["queued"]], facts["pages"]
    assert facts["api"] == {"full": [503, "database_unavailable", True], "own": [503, "database_unavailable", True]}
    # the metrics page, the down shard listed between the two others: it is said to be down, the one after it read
    assert facts["metrics"] == {"status": 200, "ok": [["default", "1.0"], ["shard1", "1.0"], ["shard2", "0.0"]],
                                "depth": [["shard1", "1.0"]], "executions": ["default", "shard1"]}, facts["metrics"]
    refused = {"ok": False, "type": "DatabaseUnavailable", "exit": 4, "results": {"unreachable": ["shard2"]}}
    verbs = ("executions", "workers", "queues", "flows")
    assert {verb: code for verb, (code, _) in facts["cli"].items()} == dict.fromkeys(verbs, 4), facts["cli"]
    cli = {verb: [code, {k: v for k, v in said.items() if k != "error"}] for verb, (code, said) in facts["cli"].items()}
    assert cli == {verb: [4, refused] for verb in verbs}, facts["cli"]  # no traceback
    assert all("shard2: connection failed" in said["error"] for _, said in facts["cli"].values()), facts["cli"]


def test_queues_schedules_the_cli_and_tasks_act_on_each_executions_shard(shard_env):
    facts = scenario(shard_env, "queues_over_shards", {"run": "qs"})
    assert all(facts["placed"].values()) and len(facts["placed"]) == 6  # each entry on its execution's shard
    assert len(facts["partition_homes"]) == 1  # a partition's entries on one shard: its cap holds
    assert facts["dedup"] == [True, False, True]
    assert facts["pending"] == 6 + 6 + 1 + 1  # stats add up both shards' entries (the dedup repeat wrote none)
    assert facts["wrong_using"] == "InvalidEnqueue"
    assert facts["cancelled"] is True and facts["entry_state"] == "cancelled"
    assert facts["task_shard"][1] == [facts["task_shard"][0]] and facts["ready"] == "READY"
    assert facts["done"] == facts["everything"], facts  # one dispatcher ran every shard's entries
    assert facts["finished"] == "SUCCESSFUL" and facts["return_value"] == 5
    assert facts["running_after"] == 0
    assert len(facts["ticks"]) == 1 and facts["ticks"][0][1] == [facts["ticks"][0][2]]
    assert facts["schedule_rows"] == {"default": True, "shard1": False}
    assert facts["listed"] == facts["expected_listed"]  # the CLI's list merges both shards, naming each
    assert facts["shown"] == [0, "shard1", "completed", "qs-q"]
    assert facts["refused"] == 2  # --database naming the other shard: usage error, nothing read there
    assert facts["queue_row"][1] == 0 and facts["queue_row"][0] >= 1  # the tick's entry waits (no dispatcher)
    assert facts["pruned"] == [2, ["qs-not-begun"]]  # reservations of shard1's begun executions pruned


def test_the_queue_page_lists_every_shards_entries_and_acts_on_each_ticked_one_on_its_own_shard(shard_env):
    """Issue 24's queue page with two shards: both shards' entries with their shard column; Cancel ticked on a
    shard1 entry cancels that one only, Reprioritise ticked on a default entry changes that one only."""
    facts = scenario(shard_env, "admin_queue_entries", {"run": "qe"})
    assert facts["listed"] == ["default", "default", "shard1", "shard1"], facts
    assert facts["boxes"] == facts["expected_boxes"], facts  # each checkbox names its row's shard
    target, other = facts["on"]["shard1"]
    first, second = facts["on"]["default"]
    assert len(facts["cancelled"]) == 1 and facts["cancelled"][0].startswith(f"Cancelled, they never start: {target}")
    assert facts["reprioritised"] == [f"Priority 42 set on: {first}"], facts
    rows = facts["rows"]
    assert rows[target] == ["cancelled", 0] and rows[other] == ["pending", 0], rows
    assert rows[first] == ["pending", 42] and rows[second] == ["pending", 0], rows


def test_a_subjects_keys_live_on_each_shard_and_one_forget_tombstones_it_on_every_shard(shard_env):
    key = "ka:" + "A" * 43 + "="  # 32 bytes, base64
    facts = scenario(shard_env, "privacy_over_shards", {"run": "pv"}, LOOM_KEYS=key)
    before, after = facts["before"], facts["after"]
    assert before["reads"] == ["ann@example.org"] * 2 and before["input"] == "ann@example.org"
    assert before["status"] == "completed"  # a sealed queued input, unsealed on its execution's shard
    assert before["clear"] == [False, False]  # sealed on both shards
    assert before["keys"] == {"default": True, "shard1": True}  # one key of the subject on each shard
    forgotten = after["forgotten"]
    assert after["reads"] == [forgotten] * 2 and after["input"] == forgotten
    assert after["tombstones"] == {"pv-ann": {"default": True, "shard1": True},
                                   "pv-bob": {"default": True, "shard1": True}}  # even where it had no key
    assert after["bob_on_second"] == forgotten  # no shard made a new key for a forgotten subject


@pytest.fixture(scope="module")
def forget_shard_down(shard_env) -> dict:
    """The facts of one scenario: a subject's data on three shards (the third a database of its own on the
    shard1 server); then the third's server stops answering (its alias re-pointed, in the scenario's process,
    at a port where nothing listens; no server is stopped): forget(), the admin's forget action and the CLI's;
    then the alias re-pointed at its server and forget run again."""
    shard1_url = shard_env["SHARD_DATABASE_URLS"].split("=", 1)[1]
    third = shard1_url[:-1] + "2"  # .../<suite db>_s1 -> .../<suite db>_s2
    server, db = urlsplit(third).netloc.split("@")[1], urlsplit(third).path.lstrip("/")
    psql(server, f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
    psql(server, f"CREATE DATABASE {db}{linguistic(server)}")
    env = {**shard_env, "SHARD_DATABASE_URLS": f"{shard_env['SHARD_DATABASE_URLS']};shard2={third}",
           "LOOM_SHARDS": "default,shard1,shard2", "LOOM_KEYS": "ka:" + "A" * 43 + "="}
    subprocess.run([sys.executable, "manage.py", "migrate", "--database", "shard2", "--noinput", "-v0"], env=env,
                   cwd=ROOT, check=True)
    facts = scenario(env, "forget_shard_down", {"run": "fd"})
    assert facts["down"] == "shard2" and facts["up"] == ["default", "shard1"]
    assert facts["before"] == {alias: ["fd-ann@example.org"] for alias in ("default", "shard1", "shard2")}
    return facts


def test_forget_with_a_shard_unreachable_raises_forget_incomplete_naming_the_shards_done_and_not(
        forget_shard_down):
    failed = forget_shard_down["failed"]
    assert failed["error"] == "ForgetIncomplete", failed  # ours, not the driver's OperationalError
    assert failed["forgotten"] == ["default", "shard1"] and failed["failed"] == ["shard2"], failed
    assert "not done on shard(s) shard2" in failed["text"] and "done on default, shard1" in failed["text"]


def test_forget_with_a_shard_unreachable_tombstones_every_reachable_shard_and_audits_only_those(
        forget_shard_down):
    facts, forgotten = forget_shard_down, forget_shard_down["forgotten"]
    assert facts["tombstones_down"] == {"default": True, "shard1": True}
    assert facts["reads_down"] == {"default": [forgotten], "shard1": [forgotten], "shard2": "OperationalError"}
    assert facts["audits_down"] == {"default": 1, "shard1": 1}
    assert facts["back"]["audits"] == {"shard2": 0}  # no audit event claims the shard that was not forgotten


def test_forget_with_a_shard_unreachable_leaves_no_key_of_it_in_the_process_cache(forget_shard_down):
    assert forget_shard_down["cached_before"]  # the read before had cached the down shard's key
    cached = forget_shard_down["cached_after"]
    assert cached is None or cached[1] is None, cached


def test_the_admins_forget_with_a_shard_unreachable_tells_the_operator_and_forgets_every_ticked_subject(
        forget_shard_down):
    """Two subjects ticked: each is forgotten on the reachable shards and named in an error with the shard it
    is not forgotten on; no 500, no success message. Every row of a search (select_across) cannot be read
    there: nothing is forgotten and the error says so. The CLI's forget says the same as a command error."""
    admin, across = forget_shard_down["admin"], forget_shard_down["admin_across"]
    assert admin["status"] == 200 and admin["successes"] == [], admin
    for who in ("fd-cid", "fd-dan"):
        assert any(f"Subject {who} is NOT forgotten on shard(s) shard2" in m for m in admin["errors"]), admin["errors"]
        assert admin["tombstones"][who] == {"default": True, "shard1": True}
    assert across["status"] == 200 and across["successes"] == [], across
    assert any("shard2" in m and "nothing was forgotten" in m for m in across["errors"]), across["errors"]
    assert across["tombstones"] == {"default": False, "shard1": False}
    cli = forget_shard_down["cli"]
    assert cli and cli[0] == "CommandError" and "not done on shard(s) shard2" in cli[1], cli
    assert forget_shard_down["cli_tombstones"] == {"default": True, "shard1": True}


def test_forget_again_once_the_shard_is_back_completes_idempotently_and_every_read_shows_the_marker(
        forget_shard_down):
    back, forgotten = forget_shard_down["back"], forget_shard_down["forgotten"]
    assert back["reads_before_again"]["shard2"] == ["fd-ann@example.org"]  # as the error said: not there yet
    assert back["again"] == [{"error": None}] * 5
    every = {"default": [forgotten], "shard1": [forgotten], "shard2": [forgotten]}
    assert back["reads"] == {who: every for who in ("fd-ann", "fd-cid", "fd-dan", "fd-eve")}
    assert all(t == {"default": True, "shard1": True, "shard2": True} for t in back["tombstones"].values())
    assert back["audits_after"] == {"default": 3, "shard1": 3, "shard2": 2}  # one per forget done on each

def test_flows_that_wait_park_wake_and_chain_on_their_own_shards(shard_env):
    facts = scenario(shard_env, "waits_over_shards", {"run": "wt"}, LOOM_FLOW_MODULES="tests.fixtures.shard_fixtures")
    assert set(facts["parked"].values()) == {"waiting"} and set(facts["waits"].values()) == {"recv"}
    assert facts["got"] == {"x": 1}  # send and get_event on the receiver's shard, woken by its shard's waker
    assert facts["woken"] is True
    assert facts["suspended"][0] == "suspended" and facts["suspended"][1][2] == "suspended"
    for where, home, state, _ in facts["receivers"].values():
        assert where == [home] and state == "completed"
    assert {home for _, home, _, _ in facts["parents"].values()} == {"default", "shard1"}
    for parent, (where, home, state, result) in facts["parents"].items():
        child = facts["children"][parent]
        assert where == [home] and state == "completed" and result["result"] == 3
        assert child[0] == [home] and child[2] == "completed"  # a default child id lives with its parent
    (pwhere, phome, pstate, presult), (cwhere, chome, cstate, _) = facts["cross"]
    assert pwhere == [phome] and cwhere == [chome] and phome != chome  # a child with its own id: the other shard
    assert pstate == "completed" and presult["result"] == 4 and cstate == "completed"  # woken after its settle
    last, (where, home, state, result), links = facts["chain"]
    assert last.endswith("~2") and state == "completed" and result == 3
    assert where == [home] == ["shard1"] and links == [["shard1"], ["shard1"]]  # a chain stays on its root's shard
    assert facts["fork"][0] == [facts["fork"][1]]  # the fork is written on its own id's shard
    assert facts["woken_count"] >= 4


def test_a_worker_sigkilled_while_owning_runs_on_both_shards_is_recovered_by_another(shard_env, tmp_path):
    eids = [f"kill-{i}" for i in range(40)]
    eids = scenario(shard_env, "status", {"eids": eids})["executions"]
    chosen = {}
    for eid, info in eids.items():
        chosen.setdefault(info["shard"], []).append(eid)
    run = chosen["default"][:2] + chosen["shard1"][:2]
    gate = tmp_path / "gate"
    log = tmp_path / "children.log"
    owner = spawn(shard_env, ["-m", "tests.fixtures.shard_scenarios", "owner",
                              json.dumps({"id": "owner-a", "eids": run, "n": 2, "gate": str(gate)})], log)
    rescuer = None
    try:
        line = owner.stdout.readline()
        assert json.loads(line) == {"leased": True}, log.read_text()[-2000:]
        os.killpg(owner.pid, signal.SIGKILL)
        owner.wait()
        gate.touch()
        rescuer = spawn(shard_env, ["manage.py", "loom_worker", "--id", "rescuer-b", "--no-cluster"], log)
        facts = wait_status(shard_env, run)
    finally:
        stop(rescuer)
        stop(owner)
    assert {e["shard"] for e in facts["executions"].values()} == {"default", "shard1"}
    assert all(e["status"] == "completed" and e["completed"] == ["s0", "s1"] for e in facts["executions"].values())
    assert all(rows == {"s0": 1, "s1": 1} for rows in facts["effects"].values())  # each step's effect once


def test_a_stopped_shard_leaves_the_other_working_and_its_runs_resume_when_it_returns(shard_env, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("stopping the shard1 server needs root (pg_ctlcluster); CI runs as root")
    version, cluster = CLUSTER.split("/")
    ctl = ["pg_ctlcluster", "--skip-systemctl-redirect", version, cluster]
    status = scenario(shard_env, "status", {"eids": [f"down-{i}" for i in range(40)]})["executions"]
    run = ([e for e, i in status.items() if i["shard"] == "default"][:2]
           + [e for e, i in status.items() if i["shard"] == "shard1"][:2])
    gate = tmp_path / "gate"
    log = tmp_path / "children.log"
    worker = spawn(shard_env, ["manage.py", "loom_worker", "--id", "steady-w", "--no-cluster"], log)
    late = None  # a worker started while shard1 is down: it must start, and work once the shard is back
    owner = spawn(shard_env, ["-m", "tests.fixtures.shard_scenarios", "owner",
                              json.dumps({"id": "owner-p", "eids": run, "n": 2, "gate": str(gate),
                                          "exit_after": True})], log)
    try:
        assert "running" in worker.stdout.readline(), log.read_text()[-2000:]
        assert json.loads(owner.stdout.readline()) == {"leased": True}, log.read_text()[-2000:]
        subprocess.run([*ctl, "stop", "-m", "fast"], check=True)
        try:
            gate.touch()
            late = spawn(shard_env, ["manage.py", "loom_worker", "--id", "late-w", "--no-cluster"], log)
            assert "running" in late.stdout.readline(), log.read_text()[-2000:]
            owner.wait(120)
            alone = scenario(shard_env, "shard0_only", {"run": "dn"})
        finally:
            subprocess.run([*ctl, "start"], check=True)
        facts = wait_status(shard_env, run, timeout=180)  # a loaded machine: recovery is one TTL, the rest is CPU
        alive = {"steady-w": worker.poll() is None, "late-w": late.poll() is None}
    finally:
        stop(owner)
        stop(worker)
        stop(late)
    assert alive == {"steady-w": True, "late-w": True}, log.read_text()[-3000:]  # no worker died of the outage
    assert set(alone["flows"].values()) == {"completed"} and alone["aggregate"] == 5 and alone["tip"] == 0
    assert alone["shard1_start"] is not None  # the stopped shard's work fails, loudly
    assert all(rows == {"s0": 1, "s1": 1} for rows in alone["effects"].values())
    executions = facts["executions"]
    assert all(e["status"] == "completed" and e["completed"] == ["s0", "s1"] for e in executions.values()), (
        facts, (tmp_path / "children.log").read_text()[-3000:])
    assert all(rows == {"s0": 1, "s1": 1} for rows in facts["effects"].values())  # nothing lost or duplicated


def test_behind_pgbouncer_in_transaction_pooling_nothing_is_prepared_and_everything_works(shard_env):
    if not listening(BOUNCER):
        pytest.skip(f"no PgBouncer on {BOUNCER}: scripts/shard-servers starts it (CI does)")
    host, port = BOUNCER.rsplit(":", 1)
    direct = urlsplit(shard_env["DATABASE_URL"])
    try:
        facts = scenario(shard_env, "pooled", {"run": "pb"},
                         DATABASE_URL=f"postgres://postgres@{host}:{port}{direct.path}",
                         POOLER_PORTS=f"{port}:{direct.port}", LOOM_SHARDS="default")
    finally:  # the pooler's server connections to this database close now (a shared server has few to spare)
        release_pooled({"HOST": host, "PORT": port, "NAME": direct.path.lstrip("/"), "USER": "postgres"})
    assert facts["errors"] == []
    assert facts["pooled"] is True and facts["prepares"] is False
    assert facts["tips"] == [19] and facts["flows"] == [3] and facts["aggregate"] == 5


def pooled_scenario(shard_env: dict, name: str, arg: dict, **overrides: str) -> dict:
    """`name` in a child whose default alias is on PgBouncer (POOLER_PORTS maps it to the server's port); the
    pooler's server connections to this database are closed at the end (a shared server has few to spare)."""
    if not listening(BOUNCER):
        pytest.skip(f"no PgBouncer on {BOUNCER}: scripts/shard-servers starts it (CI does)")
    host, port = BOUNCER.rsplit(":", 1)
    direct = urlsplit(shard_env["DATABASE_URL"])
    try:
        return scenario(shard_env, name, {**arg, "pooler": BOUNCER, "direct_port": direct.port},
                        DATABASE_URL=f"postgres://postgres@{host}:{port}{direct.path}",
                        POOLER_PORTS=f"{port}:{direct.port}", LOOM_SHARDS="default", **overrides)
    finally:
        release_pooled({"HOST": host, "PORT": port, "NAME": direct.path.lstrip("/"), "USER": "postgres"})


# Listeners' tests: polls far beyond the bound, so what happens within it was woken by a notification.
SLOW_POLLS = {"LOOM_WAIT_POLL": "30", "LOOM_QUEUE_POLL": "30", "LOOM_QUEUE_IDLE_POLL": "30",
              "LOOM_WAIT_INLINE_MAX": "0", "LOOM_WAIT_BATCH": "2", "LOOM_QUEUE_THREADS": "2"}


def test_behind_pgbouncer_every_listen_session_is_on_the_server_and_wakes_before_the_poll(shard_env):
    """The waker of parked executions, a get_event caller and the queue dispatcher, each woken through its
    LISTEN session on the server itself (LOOM_DIRECT, not one of the pooler's server connections) while
    the application's alias is on the pooler; their polls (30 s) are beyond the bound (10 s)."""
    facts = pooled_scenario(shard_env, "pooled_listeners", {"run": "pl", "bound": 10}, **SLOW_POLLS)
    assert facts["pooled"] is True and facts["direct"]["PORT"] == urlsplit(shard_env["DATABASE_URL"]).port, facts
    assert facts["waker_listening"] and facts["waker_session"] == {"count": 1, "via_pooler": False}, facts
    assert facts["parked"] == "waiting" and facts["parked_woken"], facts
    assert facts["caller_waiting"] and facts["get_event_listening"], facts
    assert facts["get_event_sessions"] == {"count": 2, "via_pooler": False}, facts  # the waker's and get_event's
    assert facts["got"] == ["to the caller"], facts
    assert facts["dispatcher_listening"] and facts["dispatcher_session"] == {"count": 1, "via_pooler": False}, facts
    assert facts["enqueued_started"], facts
    assert facts["stopped_within"] and facts["said"] == [], facts


def test_behind_pgbouncer_without_a_direct_address_every_listener_polls_and_says_so_once(shard_env):
    """A pooled alias without LOOM_DIRECT cannot LISTEN (the pooler would hand the session to other clients):
    the waker, the get_event listener and the queue dispatcher each poll (short polls here), open no LISTEN
    session, say so once in the log, and nothing hangs."""
    facts = pooled_scenario(shard_env, "pooled_listeners", {"run": "pn", "bound": 10, "no_direct": True},
                            **{**SLOW_POLLS, "LOOM_WAIT_POLL": "0.5", "LOOM_QUEUE_POLL": "0.5",
                               "LOOM_QUEUE_IDLE_POLL": "0.5"})
    assert facts["pooled"] is True and facts["direct"] is None, facts
    assert facts["waker_session"]["count"] == facts["dispatcher_session"]["count"] == 0, facts
    assert facts["get_event_sessions"]["count"] == 0 and not facts["get_event_listening"], facts
    assert facts["parked_woken"] and facts["got"] == ["to the caller"] and facts["enqueued_started"], facts
    assert facts["stopped_within"], facts
    said = [line for line in facts["said"] if "LOOM_DIRECT" in line]
    for who in ("waker", "get_event", "queue dispatcher"):
        assert len([line for line in said if who in line]) == 1, (who, facts["said"])
    assert len(said) == 3, facts["said"]


def test_manage_py_check_is_clean_with_two_real_shards_and_refuses_a_missing_alias(shard_env):
    def check(**overrides: str) -> str:
        proc = subprocess.run([sys.executable, "manage.py", "check"], env={**shard_env, **overrides}, cwd=ROOT,
                              capture_output=True, text=True)
        return proc.stdout + proc.stderr

    assert "loom.E0" not in check()
    assert "loom.E020" in check(LOOM_SHARDS="default,shard1,shard9")


def test_the_metrics_pages_executions_gauge_is_per_shard_alias_and_matches_each_shards_rows(shard_env):
    """Telemetry x shards (docs/observability.md): one gauge series per alias, each its shard's own count."""
    facts = scenario(shard_env, "telemetry_per_shard", LOOM_METRICS="true")
    assert set(facts["db"]) == {"default", "shard1"} and min(facts["db"].values()) >= 2  # runs on both shards
    assert facts["seen"] == {alias: float(n) for alias, n in facts["db"].items()}


def test_retention_keeps_a_parent_or_child_while_its_kin_on_the_other_shard_is_live(shard_env):
    facts = scenario(shard_env, "retention_kin", {"run": "rk"})
    assert (facts["parent_shard"], facts["child_shard"]) == ("default", "shard1")
    assert facts["parent_while_child_live"] == 0 and facts["child_while_parent_live"] == 0
    assert facts["both_settled"] == [1, 1] and facts["left"] == [False, False]
    assert facts["admin_due"] == "2"  # the removals page adds up what is due on both shards (one each)


def test_the_operations_pages_figures_add_up_every_shard(shard_env):
    facts = scenario(shard_env, "operations_figures", {"run": "opf"})
    assert facts["pending_shards"] == ["default", "shard1"] and facts["depth"] == 2 and facts["oldest_seen"]
    assert facts["completed_shards"] == ["default", "shard1"]
    assert facts["completed_now"] == facts["completed_in_db"] >= 2  # every shard's headers of the hour
    assert facts["troubled"] == facts["stuck"] and len(facts["stuck"]) == 2
