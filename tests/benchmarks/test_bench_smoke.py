"""Every section of every bench command runs, at tiny sizes, on the database under test.

The bench commands verify what they wrote against the rows in the database (a mismatch fails the
command); these tests run each command exactly as a user would (`call_command` with command-line
arguments), then check the recorded run: status ok, every section recorded cells or said why it
was skipped. The suite runs on SQLite and on PostgreSQL in CI, so every section is exercised on
both (PostgreSQL-only sections skip on SQLite with their reason). No timing is asserted: only that
the measuring code runs and records what it claims.
"""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.db import connection

from benchmarks.models import BenchRun
from benchmarks.sections import REACTION_SECTIONS, THROUGHPUT_SECTIONS

pytestmark = pytest.mark.django_db(transaction=True)

POSTGRES_ONLY = {"notify", "fanout", "peers", "shards"}

TINY_THROUGHPUT = [
    "--concurrency", "1,2", "--ops", "16", "--append-repeats", "2", "--repeats", "2",
    "--coalesce-writers", "3", "--batch-writers", "2", "--notify-writers", "2",
    "--exec-concurrency", "2", "--exec-rounds", "1", "--effect-ms", "0", "--sweep-concurrency", "2",
    "--flow-concurrency", "1,2", "--flow-executions", "6", "--transient-calls", "50", "--transient-repeats", "2",
    "--read-concurrency", "2", "--read-ops", "5", "--lease-concurrency", "2", "--lease-repeats", "2",
    "--lease-execs", "4", "--peer-concurrency", "1,2", "--peer-ops", "3", "--peer-repeats", "2",
    "--growth-sizes", "2000,4000", "--growth-ops", "20",
]


@pytest.fixture(autouse=True)
def stop_the_process_lease_keeper(transactional_db):
    """A bench command runs flows in this process, which may start the process's lease keeper thread; a
    real `manage.py` process ends with the command, the test process does not: stop it while the test
    database is still open, so it does not outlive the test."""
    yield
    from leases.keeper import get_keeper, keepers, reset_keeper

    get_keeper().shutdown()
    for keeper in keepers():  # one per shard a section worked on (the shards section's own aliases)
        keeper.shutdown()
    reset_keeper(None)


def run_command(name: str, *argv: str) -> tuple[BenchRun, str]:
    out = io.StringIO()
    call_command(name, *argv, "--quiet", stdout=out, stderr=io.StringIO())
    run = BenchRun.objects.filter(command=name).order_by("-id").first()
    assert run is not None, f"{name} recorded no run"
    assert run.status == BenchRun.Status.OK, run.error
    return run, out.getvalue()


def sections_of(run: BenchRun) -> dict[str, list]:
    found: dict[str, list] = {}
    for result in run.results.all():
        found.setdefault(result.section, []).append(result)
    return found


def assert_every_section(run: BenchRun, expected: set[str]) -> dict[str, list]:
    """Each expected section recorded cells, or (PostgreSQL-only, on SQLite) was skipped with a reason."""
    found = sections_of(run)
    skipped = run.settings.get("skipped") or {}
    for section in expected:
        if section in POSTGRES_ONLY and connection.vendor != "postgresql":
            assert section in skipped and "PostgreSQL" in skipped[section]
            continue
        assert found.get(section), f"section {section} recorded nothing (skipped: {skipped.get(section)})"
    return found


def test_bench_throughput_runs_every_section():
    """Every section of bench_throughput but `shards` (its own test below: it needs a second server), verified
    against the rows, recorded as one ok run."""
    chosen = [name for name in THROUGHPUT_SECTIONS if name != "shards"]
    run, output = run_command("bench_throughput", *TINY_THROUGHPUT, *[f"--section={name}" for name in chosen])
    found = assert_every_section(run, set(chosen))
    append = {(r.scenario, r.params["concurrency"]) for r in found["append"]}
    assert append == {(v, c) for v in ("per-event", "batch", "ceiling", "minimal") for c in (1, 2)}
    coalesced = {r.scenario for r in found["coalesced"] if r.params["writers"] == 3}
    assert "raw-coalescer" in coalesced and all(
        r.metrics["vs_raw_coalescer"] for r in found["coalesced"] if r.params["writers"] == 3)
    # The same 3 writers in 1 and in 2 writer processes (each its own coalescer): every timed append, 16 per
    # writer in each of the 2 rounds, counted by the children and checked against the rows in the database.
    procs = {r.scenario: r for r in found["coalesced"] if r.scenario.startswith("procs-")}
    assert sorted(procs) == ["procs-1", "procs-2"]
    assert [procs[v].params["processes"] for v in ("procs-1", "procs-2")] == [1, 2]
    assert all(r.count == r.metrics["verified_rows"] == 3 * 16 * 2 for r in procs.values())
    assert procs["procs-2"].metrics["vs_procs_1"] is not None and "vs_procs_1" not in procs["procs-1"].metrics
    assert all(r.metrics["verified_rows"] == r.count for r in found["append"])
    assert all(len(r.metrics["runs"]) == 2 for r in found["append"])  # the spread of the repeats
    # Every statement is counted on both backends (the coalescer's alone showed 0.00 on SQLite):
    for cell in found["durable"] + found["executions"]:
        counted = cell.metrics["statements_per_execution"]
        assert counted > 0 and counted >= (cell.metrics["coalesced_statements_per_execution"] or 0), cell
        if not cell.params["coalesce"]:  # a bootstrap and a settle at least, each its own statement
            assert counted >= 2, cell
    assert f"recorded as run #{run.pk}" in output


TINY_SHARDS = ["--section", "shards", "--shard-writers", "2", "--shard-appends", "6", "--shard-flow-threads", "2",
               "--shard-flows", "6", "--shard-repeats", "1"]


@pytest.fixture(scope="module")
def bench_shard_aliases(django_db_setup, django_db_blocker):
    """The shards section's database aliases, known before the test's database guard is set up (it refuses
    connections to aliases the test does not declare), dropped after this module."""
    from benchmarks.sections import shards as section

    if connection.vendor != "postgresql":
        yield
        return
    with django_db_blocker.unblock():
        shard, _ = section.prepare(connection.alias, "127.0.0.1:5433", "127.0.0.1:6432")
    if shard is None:
        pytest.skip("no second PostgreSQL server on 127.0.0.1:5433: scripts/shard-servers starts it (CI does)")
    yield
    section.forget()


def test_shards_section_says_why_it_skips_on_sqlite():
    if connection.vendor == "postgresql":
        pytest.skip("SQLite only: on PostgreSQL the test below runs the section")
    run, _ = run_command("bench_throughput", *TINY_SHARDS)
    assert "PostgreSQL" in (run.settings.get("skipped") or {})["shards"]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True, databases=["default", "bench_shard1", "bench_pooled"])
def test_shards_section_compares_one_and_two_servers_and_pgbouncer_in_one_run(bench_shard_aliases):
    """1 shard vs 2 shards (two real servers) and PgBouncer vs direct, with the ratios and the statements per
    execution on each shard; skipped without the second server."""
    from benchmarks.sections.shards import _reachable

    run, _ = run_command("bench_throughput", *TINY_SHARDS)
    cells = sections_of(run)["shards"]
    scenarios = {(c.scenario, c.params.get("layout")) for c in cells}
    assert {("coalesced appends", "1 shard"), ("coalesced appends", "2 shards"), ("1-step flows", "1 shard"),
            ("1-step flows", "2 shards")} <= scenarios
    two = next(c for c in cells if c.scenario == "1-step flows" and c.params["layout"] == "2 shards")
    one = next(c for c in cells if c.scenario == "1-step flows" and c.params["layout"] == "1 shard")
    assert len(two.metrics["executions_per_shard"]) == 2  # both servers did work
    # the statements an execution costs on its shard do not change with the number of shards (a bootstrap and
    # a settle; the keeper's lease statements and each thread's first statements spread over few executions)
    for figure in (*one.metrics["statements_per_execution_per_shard"].values(),
                   *two.metrics["statements_per_execution_per_shard"].values()):
        assert 2 <= figure <= 3
    ratios = {c.scenario: c.metrics["ratio"] for c in cells if c.scenario.endswith("ratio")}
    assert ratios["coalesced appends ratio"] > 0 and ratios["1-step flows ratio"] > 0
    if _reachable("127.0.0.1:6432"):
        assert ratios["pooled ratio"] > 0


def test_peers_section_records_both_peers_beside_us_in_one_run():
    """eventsourcing beside our aggregate do(), DBOS beside our durable one-step flow, each at every
    concurrency, with the ratio ours / theirs; on SQLite, or without the packages, one line and a skip."""
    from benchmarks.sections.peers import missing_packages

    run, output = run_command("bench_throughput", "--section", "peers", "--peer-concurrency", "1,2",
                              "--peer-ops", "3", "--peer-repeats", "2")
    skipped = run.settings.get("skipped") or {}
    if connection.vendor != "postgresql" or missing_packages():
        assert "peers" in skipped and "peers: skipped:" in output
        return
    cells = {(r.scenario, r.params["concurrency"]): r for r in run.results.filter(section="peers")}
    assert set(cells) == {(s, c) for s in ("ours: aggregate do()", "eventsourcing", "ours: durable one-step flow",
                                           "DBOS one-step workflow") for c in (1, 2)}
    for cell in cells.values():
        ratio = cell.metrics["vs_eventsourcing" if cell.params["peer"] == "eventsourcing" else "vs_dbos"]
        assert ratio is not None and ratio > 0 and cell.p50_ms is not None and len(cell.metrics["runs"]) == 2


def test_read_section_counts_the_statements_and_rows_of_loading_running_executions():
    """The read cells are of running executions; statements per load are counted (two: snapshot and
    tail), and the long one reads its snapshot plus a short tail, not its 102 events."""
    run, _ = run_command("bench_throughput", "--section", "read", "--read-concurrency", "2", "--read-ops", "4")
    cells = {r.scenario: r for r in run.results.filter(section="read")}
    short, long = cells["4-event"], cells["102-event"]
    for cell in (short, long):
        assert cell.params["status"] == "running"
        assert cell.metrics["queries_per_read"] == 2.0
    assert short.metrics["rows_per_read"] == 4 and short.metrics["snapshot_seq"] == -1
    assert long.metrics["step_records"] == 51  # 50 completed, and the last one started
    assert long.metrics["snapshot_seq"] >= 0 and long.metrics["rows_per_read"] == 1 + long.metrics["tail_rows"]
    assert long.metrics["tail_rows"] < 16
    assert cells["long/short p50"].metrics["ratio"] is not None


def test_bench_privacy_records_overheads_forget_and_content_loads():
    """bench_privacy at tiny sizes: sealed vs plain append and load with their overhead, a forget that wrote
    one event and rewrote none, and a content-store load of one batched call and no extra statement."""
    run, _ = run_command("bench_privacy", "--privacy-writers", "2", "--privacy-ops", "5", "--privacy-loads", "3",
                         "--privacy-repeats", "2", "--forget-events", "200")
    cells = {(r.scenario, r.params.get("variant")): r for r in run.results.filter(section="privacy")}
    assert set(cells) == {("append", "plain"), ("append", "sealed"), ("load", "plain"), ("load", "sealed"),
                          ("forget", None), ("content-load", "plain"), ("content-load", "big")}
    assert cells[("append", "sealed")].metrics["overhead"] is not None
    # the keys of the read's subjects: in the read's own statement on PostgreSQL, one statement more on SQLite
    assert cells[("load", "sealed")].metrics["statements_per_load"] == (1.0 if connection.vendor == "postgresql"
                                                                         else 2.0)
    assert cells[("load", "plain")].metrics["statements_per_load"] == 1.0
    forgot = cells[("forget", None)].metrics
    assert forgot["events_written"] == 1 and forgot["event_rows_rewritten"] == 0
    big = cells[("content-load", "big")].metrics
    assert big["content_calls_per_load"] == 1.0 and big["extra_statements"] == 0.0
    from journal.models import ContentLink, DataKey

    assert not DataKey.objects.filter(subject__startswith=f"bench:{run.pk}:").exists()  # its rows are removed
    assert not ContentLink.objects.filter(subject__startswith=f"bench:{run.pk}:").exists()


def test_bench_lease_runs_both_shapes_and_id_styles():
    """bench_lease: off/eager/lazy for noop and io, caller and minted ids; each mode against off has a
    verdict, and a figure is withheld when its repeats spread wider than the effect."""
    run, output = run_command("bench_lease", "--lease-concurrency", "2", "--lease-repeats", "2",
                              "--lease-execs", "4", "--lease-io-execs", "4", "--lease-io-ms", "1")
    cells = sections_of(run)["lease"]
    assert {r.scenario for r in cells} == {f"{i}/{s}/{m}" for i in ("caller", "minted") for s in ("noop", "io")
                                           for m in ("off", "eager", "lazy")}
    for cell in cells:
        if cell.params["mode"] == "off":
            continue
        assert cell.metrics["verdict"] in ("spread too wide", "overhead", "faster")
        if cell.metrics["verdict"] == "spread too wide":
            assert cell.metrics["overhead_pct"] is None
            assert f"{cell.scenario.rsplit('/', 1)[0]}/c=2 {cell.params['mode']} vs off: spread too wide" in output
        else:
            assert cell.metrics["overhead_pct"] is not None


def test_bench_reactions_runs_every_section():
    """Latency (idle and a sustained rate in a producer process), contention, watermark, replay, lanes;
    the latency cells' throughput is the commit rate, in commits/s (their latencies are in ms)."""
    run, _ = run_command("bench_reactions", "--rates", "idle,40", "--seconds", "0.5", "--workers", "1,2",
                         "--streams", "6", "--subscriptions", "40", "--replay", "100")
    found = assert_every_section(run, set(REACTION_SECTIONS))
    for cell in found["latency"]:
        assert cell.unit == "commits/s" and cell.throughput and cell.throughput > 0
        assert cell.p50_ms is not None


def test_bench_aggregates_runs_every_scenario():
    """Every aggregate scenario, verified, at a handful of operations."""
    from benchmarks.sections.aggregates import SCENARIOS

    run, _ = run_command("bench_aggregates", "--iterations", "5", "--rounds", "2", "--fanout", "3",
                         "--contenders", "3", "--reservations", "3", "--stock", "2")
    cells = sections_of(run)["aggregates"]
    assert len(cells) >= len(SCENARIOS)


def test_bench_http_runs_against_a_real_server(monkeypatch):
    """bench_http starts serve_api on loopback on the database the run writes to (the connection's settings:
    the environment's DATABASE_URL names a database that does not exist), validates every response."""
    monkeypatch.setenv("DATABASE_URL", "postgres://nobody@127.0.0.1:9/no_such_database")
    run, _ = run_command("bench_http", "--requests", "8", "--concurrency", "1", "2", "--workers", "1",
                         "--warmup", "2")
    cells = sections_of(run)["http"]
    modes = {(r.scenario, r.params.get("concurrency")) for r in cells}
    assert {("fresh", 1), ("fresh", 2), ("state", 1), ("state", 2)} <= modes


def test_bench_schedules_records_tick_lateness_of_every_schedule():
    """bench_schedules: each schedule's tick started once (verified against its queued execution), lateness
    percentiles recorded; the section's schedules, queued executions and entries are cleaned up."""
    from django_q.models import OrmQ

    from leases.models import Schedule, StartReservation

    run, _ = run_command("bench_schedules", "--schedule-count", "12", "--schedule-seconds", "3",
                         "--schedule-tickers", "2", "--schedule-every", "0.1")
    (cell,) = sections_of(run)["schedules"]
    assert cell.count == 12 and cell.params["schedules"] == 12 and cell.unit == "ticks/s"
    assert not Schedule.objects.exists() and not StartReservation.objects.exists() and not OrmQ.objects.exists()
    from journal.models import Execution
    from queues.models import QueueEntry

    # Issue #24: each tick is a queued execution with its entry; the section deletes them too.
    assert not QueueEntry.objects.exists() and not Execution.objects.exists()


def test_bench_queues_records_every_scenario_within_its_caps():
    """bench_queues at tiny sizes, with real worker processes: the cap and the partition cap never
    exceeded in the 10 ms samples, the rate limit never exceeded in any window, tasks on Loom (and on
    django-tasks-db when installed) with latency percentiles; the section's rows are cleaned up."""
    from django.apps import apps

    from queues.models import Queue, QueueEntry

    run, _ = run_command("bench_queues", "--queue-execs", "24", "--queue-cap", "3", "--queue-partition-execs", "12",
                         "--queue-partitions", "4", "--queue-rate", "4", "--queue-rate-period", "0.5",
                         "--queue-task-execs", "6", "--queue-latency-tasks", "3", "--queue-poll", "0.05")
    cells = {cell.scenario: cell for cell in sections_of(run)["queues"]}
    assert 1 <= cells["cap"].metrics["max_running"] <= 3 and cells["cap"].count == 24
    # At this size a one-step run can start and settle between two 10 ms samples, so a sample may see none.
    assert cells["partitions"].metrics["max_running_per_partition"] <= 1 and cells["partitions"].metrics["samples"] > 0
    assert 1 <= cells["rate"].metrics["max_in_window"] <= 4
    assert cells["tasks loom"].count == 6 and cells["tasks loom"].params["tasks"] == 6  # every task ran, counted
    assert ("tasks django-tasks-db" in cells) == apps.is_installed("django_tasks_db")
    assert not Queue.objects.filter(pk__startswith="bq").exists()
    assert not QueueEntry.objects.filter(queue__name__startswith="bq").exists()


def test_bench_waits_runs_every_section():
    """Timer lateness, message round trips and idle sleeping flows, each woken by a real loom_worker child
    on the test database; every cell verified against the rows (probes fired once, every message
    received once, every sleeping flow completed)."""
    from benchmarks.sections import WAITS_SECTIONS

    run, _ = run_command("bench_waits", "--timer-pending", "3,6", "--timer-probes", "3", "--timer-spacing-ms", "5",
                         "--timer-fill-threads", "2", "--msg-concurrency", "1,2", "--msg-rounds", "2",
                         "--msg-repeats", "2", "--idle-flows", "5", "--idle-sample-seconds", "1",
                         "--idle-fill-threads", "2")
    found = assert_every_section(run, set(WAITS_SECTIONS))
    assert {r.params["pending"] for r in found["timers"]} == {3, 6}
    for cell in found["timers"]:
        assert cell.count == 3 and cell.p99_ms is not None and cell.metrics["due_query_plan"]
    assert {r.params["concurrency"] for r in found["messages"]} == {1, 2}
    assert all(len(r.metrics["runs"]) == 2 for r in found["messages"])
    idle = found["idle"][0]
    assert idle.count == 5 and idle.metrics["sleeping_at_once"] == 5 and idle.metrics["threads_while_asleep"] > 0
