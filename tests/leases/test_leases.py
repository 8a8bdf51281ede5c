"""Heartbeat leases on either database: acquire, renew_many, release, takeover, recovery, lazy
grace. The keeper is driven step by step (no thread) where statements are counted."""

from __future__ import annotations

import json
import threading
import time

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

from journal import coalesce
from journal.envelopes import Envelope
from journal.exceptions import StaleFence
from journal.flows import start
from journal.flows.ownership import get_ownership, set_ownership
from journal.models import Event, Execution, Fence
from journal.store import store_for as journal_store
from leases.keeper import LeaseKeeper, reset_keeper
from leases.models import Lease, Worker
from leases.ownership import LeaseOwnership
from leases.recovery import sweep
from leases.store import store_for
from tests.fixtures import lease_flows  # noqa: F401  (registers the flows)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def short_leases(settings):
    settings.LOOM_LEASE_TTL = 2.0
    settings.LOOM_LEASE_RENEW_EVERY = 0.1
    settings.LOOM_LEASE_LAZY_GRACE = 0.1
    settings.LOOM_LEASE_CHUNK = 500
    settings.LOOM_LEASE_MODE = "lazy"
    installed = get_ownership()
    yield
    set_ownership(installed)  # what leases/apps.py installed, for the tests that follow
    reset_keeper(None)


def running(eid: str, flow: str = "leases.noop") -> str:
    """A running execution with its stream opened (fence token 1) and its header row."""
    Event.objects.open_stream(eid, Envelope("EXECUTION_STARTED", {"flow": flow, "input": {}}))
    Execution.objects.create(id=eid, flow=flow)
    return eid


def statements(ctx, table_verb: str) -> int:
    return sum(1 for q in ctx.captured_queries if table_verb in " ".join(q["sql"].split()))


def wait_until(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.02)


def test_renewals_cost_one_renew_many_per_chunk_per_tick(settings):
    """N leases: acquires group-committed, one renew_many per chunk per tick, releases grouped."""
    settings.LOOM_LEASE_CHUNK = 100
    ids = [f"r{i:04d}" for i in range(250)]
    Fence.objects.bulk_create([Fence(stream_id=eid, token=1) for eid in ids])
    keeper = LeaseKeeper("node-a", autostart=False)
    claims = [keeper.begin_eager(eid, 1, wait=False) for eid in ids]
    with CaptureQueriesContext(connection) as ctx:
        keeper.step()  # group commit of 250 acquires, then the first tick
    assert statements(ctx, "INSERT INTO leases_lease") == 3
    assert statements(ctx, "UPDATE leases_lease") == 3
    assert Lease.objects.filter(owner="node-a").count() == 250
    assert not any(c.lost for c in claims)
    for _ in range(2):
        with CaptureQueriesContext(connection) as ctx:
            keeper.tick()
        assert statements(ctx, "UPDATE leases_lease") == 3  # ceil(250 / 100), whatever N is
        assert len(ctx.captured_queries) == 4  # plus the worker row's heartbeat
    for claim in claims:
        claim.end()
    with CaptureQueriesContext(connection) as ctx:
        keeper.step()  # a full chunk of releases goes out at once, one DELETE per chunk
    assert statements(ctx, "DELETE FROM leases_lease") == 3
    assert Lease.objects.count() == 0
    assert keeper.stats["renew_statements"] == 9


def test_releases_ride_along_with_the_next_acquire_statement():
    """A settled run's release and a new run's acquire are one statement, not two."""
    Fence.objects.bulk_create([Fence(stream_id=eid, token=1) for eid in ("g1", "g2", "g3")])
    keeper = LeaseKeeper("node-g", autostart=False)
    first = [keeper.begin_eager(eid, 1, wait=False) for eid in ("g1", "g2")]
    keeper.step()
    for claim in first:
        claim.end()
    with CaptureQueriesContext(connection) as ctx:
        keeper.step()  # releases are not urgent: alone, they wait for their delay
    assert not ctx.captured_queries and Lease.objects.count() == 2
    keeper.begin_eager("g3", 1, wait=False)
    with CaptureQueriesContext(connection) as ctx:
        keeper.step()
    lease_statements = [q for q in ctx.captured_queries if "leases_lease" in q["sql"]]
    assert len(lease_statements) == 1 or connection.vendor == "sqlite"  # SQLite: two in one transaction
    assert list(Lease.objects.values_list("execution_id", flat=True)) == ["g3"]
    assert keeper.stats["acquire_statements"] == 2 and keeper.stats["release_statements"] == 0


def test_acquire_is_refused_for_a_stale_token_and_moves_to_a_higher_one():
    """A run whose fence was advanced gets no lease; a resume's higher token supersedes the owner."""
    running("x1")
    a, b = LeaseKeeper("a", autostart=False), LeaseKeeper("b", autostart=False)
    first = a.begin_eager("x1", 1, wait=False)
    a.step()
    assert Lease.objects.get().owner_id == "a" and not first.lost
    token = Fence.objects.advance("x1")
    late = a.begin_eager("x1", 1, wait=False)  # a stale token: refused even by its own owner
    second = b.begin_eager("x1", token, wait=False)
    b.step()
    a.step()
    assert late.lost and not second.lost
    lease = Lease.objects.get()
    assert (lease.owner_id, lease.fence_token) == ("b", 2)
    a.tick()  # the former owner's renewal finds nothing: it learns it lost
    assert first.lost


def test_lazy_runs_within_the_grace_write_no_lease_rows(settings):
    settings.LOOM_LEASE_LAZY_GRACE = 30.0
    settings.LOOM_LEASE_TTL = 90.0
    keeper = LeaseKeeper("lazy-node")
    set_ownership(LeaseOwnership("lazy", keeper))
    for _ in range(20):
        assert start("leases.noop", {}).status == "completed"
    assert keeper.drain()
    assert Lease.objects.count() == 0
    assert keeper.stats["acquire"] == 0 and keeper.stats["release"] == 0
    assert not keeper.pending
    keeper.shutdown()


def test_a_long_lazy_run_acquires_after_the_grace_and_releases_at_the_end():
    keeper = LeaseKeeper("lazy-node")
    set_ownership(LeaseOwnership("lazy", keeper))
    outcome = {}
    def run() -> None:
        try:
            outcome["o"] = start("leases.sleepy", {"seconds": 1.0}, execution_id="long-1")
        finally:
            connections.close_all()

    runner = threading.Thread(target=run)
    runner.start()
    wait_until(lambda: Lease.objects.filter(execution_id="long-1").exists() or not runner.is_alive())
    lease = Lease.objects.filter(execution_id="long-1").first()
    runner.join()
    assert lease is not None and (lease.owner_id, lease.fence_token) == ("lazy-node", 1)
    assert outcome["o"].status == "completed"
    assert keeper.drain()
    assert Lease.objects.count() == 0
    keeper.shutdown()


def test_eager_mode_leases_before_the_first_step(settings):
    keeper = LeaseKeeper("eager-node")
    set_ownership(LeaseOwnership("eager", keeper))
    seen = {}

    def probe():
        seen["rows"] = list(Lease.objects.values_list("execution_id", "owner", "fence_token"))
        return 1

    from journal.flows import flow

    @flow("leases.test_probe")
    def probe_flow(ctx, value):
        return ctx.step("probe", probe)

    start("leases.test_probe", {}, execution_id="e-1")
    assert seen["rows"] == [("e-1", "eager-node", 1)]
    assert keeper.drain()
    assert Lease.objects.count() == 0
    keeper.shutdown()


def test_takeover_moves_an_expired_lease_and_advances_the_fence(settings):
    settings.LOOM_LEASE_TTL = 0.05
    running("t1")
    a = LeaseKeeper("a", autostart=False)
    claim = a.begin_eager("t1", 1, wait=False)
    a.step()
    time.sleep(0.1)  # let the 50 ms lease expire
    assert claim.lost  # its owner knows: the renewal is older than the TTL
    taken = store_for().takeover("b", ttl=30, orphan_after=30, max_attempts=5, limit=10)
    assert taken.taken == [("t1", 2)] and taken.stuck == []
    lease = Lease.objects.get()
    assert (lease.owner_id, lease.fence_token) == ("b", 2)
    assert Fence.objects.current("t1") == 2
    # Counted once the resumed run reaches the database (#35: a takeover whose run could not connect is no
    # attempt), and only under the takeover's fence.
    assert Execution.objects.get(id="t1").recoveries == 0
    assert journal_store().count_recovery("t1", 1) is False
    assert journal_store().count_recovery("t1", 2) is True
    assert Execution.objects.get(id="t1").recoveries == 1
    with pytest.raises(StaleFence):
        Event.objects.append("t1", Envelope("Late"), fence_token=1)
    assert store_for().renew_many("a", [("t1", 1)], 30) == set()
    # A live lease is not taken.
    assert store_for().takeover("c", ttl=30, orphan_after=30, max_attempts=5, limit=10).taken == []


def test_an_execution_without_a_lease_is_taken_only_after_grace_plus_ttl():
    running("o1")
    store = store_for()
    assert store.takeover("b", ttl=30, orphan_after=60, max_attempts=5, limit=10).taken == []
    assert store.takeover("b", ttl=30, orphan_after=0, max_attempts=5, limit=10).taken == [("o1", 2)]


def test_recovery_marks_an_execution_stuck_after_max_attempts(settings):
    settings.LOOM_RECOVERY_MAX_ATTEMPTS = 2
    running("s1")
    Execution.objects.filter(id="s1").update(recoveries=2)
    settings.LOOM_LEASE_LAZY_GRACE = 0.0
    settings.LOOM_LEASE_TTL = 0.05
    time.sleep(0.1)
    result = sweep("b")
    assert result.stuck == ["s1"] and result.taken == []
    header = Execution.objects.get(id="s1")
    assert header.status == Execution.Status.STUCK and "gave up after 2" in header.error
    assert Fence.objects.current("s1") == 2 and Lease.objects.count() == 0
    assert sweep("b").stuck == []  # not retried forever


def test_sweep_leaves_flows_this_worker_cannot_run_to_others(settings):
    """A worker without a flow's code does not take its executions (nor burn their attempts)."""
    settings.LOOM_LEASE_LAZY_GRACE = 0.0
    settings.LOOM_LEASE_TTL = 0.05
    running("known1")
    running("alien1", flow="elsewhere.only")
    time.sleep(0.1)
    assert [eid for eid, _ in sweep("b").taken] == ["known1"]
    assert Execution.objects.get(id="alien1").recoveries == 0


def test_sweep_is_disabled_when_leases_are_off(settings):
    settings.LOOM_LEASE_MODE = "off"
    running("off1")
    Execution.objects.filter(id="off1").update(recoveries=0)
    assert sweep("b").taken == []


def test_shutdown_hands_leases_back_expired_and_marks_the_worker_stopped():
    running("h1")
    keeper = LeaseKeeper("stopping")
    claim = keeper.begin_eager("h1", 1)
    assert not claim.lost
    assert keeper.shutdown() == 1
    assert claim.lost
    assert store_for().takeover("b", ttl=30, orphan_after=30, max_attempts=5, limit=10).taken == [("h1", 2)]
    assert Worker.objects.get(id="stopping").stopped_at is not None


def test_the_installed_ownership_follows_the_mode(settings):
    from leases.ownership import install

    assert install("off") == "off"
    assert type(get_ownership()).__name__ == "NoOwnership"
    install("eager")
    assert get_ownership().mode == "eager"


def test_admin_shows_leases_workers_and_stuck_executions(admin_client):
    running("adm1")
    running("adm2")
    running("adm3")
    Execution.objects.filter(id="adm2").update(status="stuck", error="recovery gave up after 5 attempts")
    keeper = LeaseKeeper("admin-node", autostart=False)
    keeper.begin_eager("adm1", 1, wait=False)
    keeper.begin_eager("adm3", 1, wait=False)
    keeper.step()
    store_for().expire_many("admin-node", [("adm3", 1)])
    for url, expected in (("/admin/leases/lease/", "admin-node"), ("/admin/leases/worker/", "admin-node"),
                          ("/admin/leases/worker/admin-node/change/", "adm1"),
                          ("/admin/leases/recoveryview/", "adm2"),
                          ("/admin/leases/recoveryview/adm3/change/", "admin-node"),
                          ("/admin/journal/execution/adm1/change/", "owner admin-node, fence token 1")):
        response = admin_client.get(url)
        assert response.status_code == 200, url
        assert expected in response.content.decode(), url


def _probe_flow(name: str, seen: dict, gate: threading.Event | None = None):
    from journal.flows import flow

    def probe():
        seen["rows"] = list(Lease.objects.values_list("execution_id", "owner", "fence_token"))
        seen["running"] = True
        if gate is not None:
            assert gate.wait(20)
        return 1

    @flow(name)
    def probe_flow(ctx, value):
        return ctx.step("probe", probe)

    return name


@pytest.mark.postgres
@pytest.mark.parametrize("coalesced", [False, True], ids=["direct", "coalesced"])
def test_an_eager_run_writes_and_removes_its_lease_inside_its_bootstrap_and_settle(settings, coalesced):
    """PostgreSQL eager starts lease inline: the bootstrap statement writes the lease (owner, token 1)
    and the settle statement deletes it, so a run that settles before the keeper's tick costs the
    same statements as heartbeat off and no keeper statement at all (direct or coalesced)."""
    settings.LOOM_COALESCE = coalesced
    settings.LOOM_LEASE_RENEW_EVERY = 60.0  # no tick during the run
    try:
        _inline_run(coalesced)
    finally:
        coalesce.close_shared()  # its flushers' connections must not outlive the test


def _inline_run(coalesced: bool) -> None:
    seen: dict = {}
    flow = _probe_flow(f"leases.inline_probe_{int(coalesced)}", seen)
    set_ownership(None)
    with CaptureQueriesContext(connection) as off:
        assert start(flow, {}, execution_id="off-1").status == "completed"
    keeper = LeaseKeeper("inline-node", autostart=False)
    set_ownership(LeaseOwnership("eager", keeper))
    with CaptureQueriesContext(connection) as eager:
        assert start(flow, {}, execution_id="inl-1").status == "completed"
    assert seen["rows"] == [("inl-1", "inline-node", 1)]  # the lease was there while the step ran
    assert Lease.objects.count() == 0  # ... and the settle removed it
    assert len(eager.captured_queries) == len(off.captured_queries)  # no extra statement on the run's connection
    if not coalesced:
        # the lease rides in the bootstrap and the settle; the only other lease statement is the probe's read
        assert statements(eager, "lease_boot AS") == 1 and statements(eager, "lease_end AS") == 1
        assert statements(eager, "leases_lease") == statements(off, "leases_lease") + 2
    assert {k: v for k, v in keeper.stats.items() if v} == {"inline": 1}  # the keeper sent nothing
    assert not keeper.holding() and not keeper.acquire_q and not keeper.release_q


@pytest.mark.postgres
def test_a_long_inline_eager_run_is_renewed_by_the_keeper_and_its_takeover_refuses_it(settings):
    """A run still going at the keeper's tick gets its inline lease renewed by renew_many; once the
    lease has expired another worker takes it over (fence 2) and the run stops at its next write."""
    settings.LOOM_LEASE_TTL = 0.5
    seen: dict = {}
    gate = threading.Event()
    flow = _probe_flow("leases.inline_long", seen, gate)
    keeper = LeaseKeeper("inline-long", autostart=False)
    set_ownership(LeaseOwnership("eager", keeper))
    outcome: dict = {}

    def run():
        try:
            outcome["value"] = start(flow, {}, execution_id="long-1")
        except Exception as exc:
            outcome["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        wait_until(lambda: seen.get("running"))
        assert [c.execution_id for c in keeper.holding()] == ["long-1"]
        before = Lease.objects.get(execution_id="long-1").expires_at
        keeper.tick()  # the keeper learned of the lease without a statement; it renews it now
        assert keeper.stats["renew"] == 1 and keeper.stats["renew_statements"] == 1
        assert keeper.stats["acquire_statements"] == 0
        assert Lease.objects.get(execution_id="long-1").expires_at > before
        assert Worker.objects.filter(id="inline-long").exists()  # the node row came with the first tick
        wait_until(lambda: Lease.objects.filter(execution_id="long-1", expires_at__lt=_db_now()).exists())
        taken = store_for("default").takeover("other", 30.0, 30.0, 5, 10)
        assert taken.taken == [("long-1", 2)]
        keeper.tick()  # the former owner's renewal fails: its claim is lost
        assert not keeper.holding()
    finally:
        gate.set()
        thread.join(20)
    assert "value" not in outcome and type(outcome["error"]).__name__ == "OwnershipLost"
    assert Lease.objects.get(execution_id="long-1").owner_id == "other"  # the settle deleted nothing
    assert Fence.objects.get(stream_id="long-1").token == 2
    keeper.shutdown()


def _db_now():
    from django.db.models.functions import Now

    return Now()


LIVE = 20_000  # running executions with live leases: enough that a scan of them costs more than the indexes


def _plan_nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", []):
        yield from _plan_nodes(child)


def test_the_recovery_sweep_reads_the_lapsed_executions_by_index_not_every_running_one():
    """Issue 16 (growth): the candidates statement of a common sweep reads the expired leases by their
    expires_at index and the orphans (running, no lease) by the partial index of running executions'
    updated_at, only among the headers that passed the grace within its window, then each header by
    primary key. The 20,000 live executions are long runs whose headers are all older than the grace
    (a running header's updated_at stays at its start: steps and renewals do not touch it), so reading
    every header past the grace would read each of them on every sweep: neither journal_execution nor
    leases_lease is scanned and no node reads 100 rows (PostgreSQL), the orphan arm is a range on both
    ends and the statement runs fewer VM instructions than there are live executions (SQLite). It takes
    exactly the expired and the recent orphans; the old orphans are the full orphan pass's, which takes
    them."""
    from datetime import UTC, datetime, timedelta

    from leases.store import postgres as pg_statements
    from leases.store import sqlite as sqlite_statements

    store = store_for()
    now = datetime.now(UTC)
    live = [f"live-{n:05d}" for n in range(LIVE)]
    Execution.objects.bulk_create((Execution(id=eid, flow="leases.noop", updated_at=now - timedelta(hours=1))
                                   for eid in live), batch_size=2000)  # Django 5.2: one statement is > 65,535 params
    store.fill_leases("holder", live, 1, 3600)
    expired = [running(f"exp-{n}") for n in range(5)]
    store.fill_leases("holder", expired, 1, -60)
    recent = [running(f"orph-{n}") for n in range(3)]
    Execution.objects.filter(id__in=recent).update(updated_at=now - timedelta(seconds=90))
    old = [running(f"orph-old-{n}") for n in range(2)]
    Execution.objects.filter(id__in=old).update(updated_at=now - timedelta(hours=2))
    params = {"limit": 20, "any_flow": False, "flows": ["leases.noop"]}
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE journal_execution")
        cursor.execute("ANALYZE leases_lease")
        if connection.vendor == "postgresql":
            cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + pg_statements.TAKEOVER_CANDIDATES,
                           {**params, "orphan": 60.0, "window": 300.0})
            plan = cursor.fetchone()[0]
            nodes = list(_plan_nodes((plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]))
            scans = [n for n in nodes if n.get("Relation Name") in ("journal_execution", "leases_lease")]
            assert scans and all(n["Node Type"] != "Seq Scan" for n in scans), nodes
            read = max((n.get("Actual Rows", 0) + n.get("Rows Removed by Filter", 0)) * n.get("Actual Loops", 1)
                       for n in scans)
            assert read < 100, (read, nodes)  # the 8 lapsed ones, not 20,000 live ones
        else:
            cutoff = now - timedelta(seconds=60)
            sqlite_params = {**params, "flows": json.dumps(params["flows"]), "now": sqlite_statements.stamp(now),
                             "orphan": sqlite_statements.stamp(cutoff),
                             "since": sqlite_statements.stamp(cutoff - timedelta(seconds=300))}
            cursor.execute("EXPLAIN QUERY PLAN " + sqlite_statements.TAKEOVER_CANDIDATES, sqlite_params)
            details = [row[3] for row in cursor.fetchall()]
            reads = [d for d in details if d.startswith(("SCAN", "SEARCH")) and " json_each" not in d
                     and not d.startswith("SCAN c")]
            assert reads and all(d.startswith("SEARCH") for d in reads), details
            assert any("journal_exec_running_upd (updated_at>? AND updated_at<?)" in d for d in reads), details
            assert any("expires_at<?" in d for d in reads), details
            steps = []  # one entry per 100 VM instructions the statement runs
            connection.connection.set_progress_handler(lambda: steps.append(1), 100)
            try:
                cursor.execute(sqlite_statements.TAKEOVER_CANDIDATES, sqlite_params)
                assert len(cursor.fetchall()) == 8
            finally:
                connection.connection.set_progress_handler(None, 0)
            assert len(steps) * 100 < LIVE, len(steps)  # it cannot have visited each live execution
    taken = store.takeover("sweeper", ttl=30, orphan_after=60, max_attempts=5, limit=20, flows=["leases.noop"],
                           orphan_window=300)
    assert taken.taken == sorted((eid, 2) for eid in expired + recent) and taken.stuck == []
    full = store.takeover("sweeper", ttl=30, orphan_after=60, max_attempts=5, limit=20, flows=["leases.noop"])
    assert full.taken == [(eid, 2) for eid in old] and full.stuck == []


@pytest.mark.postgres
def test_two_sweepers_take_disjoint_executions_and_the_second_skips_the_first_ones_locks():
    """FOR UPDATE OF e SKIP LOCKED through the two arms: while one sweeper holds the candidates it
    selected (first 3 of 6 expired, by id), a second sweeper takes exactly the other 3 at once: it
    neither waits for the first's row locks (it would then take all 6) nor takes them twice."""
    from django.db import transaction

    from leases.store.postgres import TAKEOVER_CANDIDATES

    eids = [running(f"pair-{n}") for n in range(6)]
    store_for().fill_leases("holder", eids, 1, -60)
    locked, done, seen = threading.Event(), threading.Event(), {}

    def first_sweeper():
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(TAKEOVER_CANDIDATES, {"orphan": 60.0, "window": None, "limit": 3, "any_flow": True,
                                                      "flows": []})
                seen["first"] = [row[0] for row in cursor.fetchall()]
                locked.set()
                done.wait(30)
        finally:
            locked.set()
            connection.close()

    thread = threading.Thread(target=first_sweeper)
    thread.start()
    try:
        assert locked.wait(30)
        second = store_for().takeover("second", ttl=30, orphan_after=60, max_attempts=5, limit=10)
    finally:
        done.set()
        thread.join(30)
    assert seen["first"] == eids[:3]
    assert second.taken == [(eid, 2) for eid in eids[3:]]


def test_the_keeper_lives_on_after_an_error_that_is_not_the_databases(monkeypatch, caplog):
    """An exception of another kind in a pass (here the session set-up raising RuntimeError, three passes in a
    row) is logged and the pass retried: the keeper thread does not die, the lease it took is renewed and
    released as usual, and the streak's traceback is logged once (then a line at the 2nd failure)."""
    keeper = LeaseKeeper("err-node")
    failures = []
    store_class = type(store_for())
    original = store_class.prepare_keeper_session

    def flaky(self) -> None:
        if len(failures) < 3:
            failures.append(1)
            raise RuntimeError("not a database error")
        original(self)

    monkeypatch.setattr(store_class, "prepare_keeper_session", flaky)
    eid = running("err-1")
    with caplog.at_level("WARNING", logger="loom.leases"):
        claim = keeper.begin_eager(eid, 1, wait=True)
    assert len(failures) == 3 and keeper.thread.is_alive()
    assert Lease.objects.filter(execution_id=eid, owner="err-node").exists()
    mine = [r for r in caplog.records if "err-node" in r.getMessage()]
    assert [(r.levelname, r.exc_info is not None) for r in mine] == [("ERROR", True), ("WARNING", False)]
    claim.end()
    assert keeper.drain()
    assert Lease.objects.filter(execution_id=eid).count() == 0
    keeper.shutdown()
