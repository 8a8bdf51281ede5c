"""Child processes of tests/journal/test_shards.py: each scenario runs in a Django process configured for two real
shards (the environment names them), and prints one JSON line of facts for the test to assert on.

    python -m tests.shard_scenarios <scenario> [json argument]
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time

import django


def _on(alias: str, stream_id: str) -> bool:
    from journal.models import Event

    return Event.objects.using(alias).filter(stream_id=stream_id).exists()


def _where(stream_id: str) -> list[str]:
    from journal import shards

    return [alias for alias in shards.shards() if _on(alias, stream_id)]


def setup(arg) -> dict:
    from journal import shards
    from tests import shard_fixtures

    for alias in shards.shards():
        shard_fixtures.create_tables(alias)
    return {"shards": shards.shards()}


def placement(arg) -> dict:
    """Streams written by every entry point land on the shard shard_for names, and only there."""
    from django.db import connections
    from django.test.utils import CaptureQueriesContext

    from benchmarks.domains.counter import Increment
    from journal import shards
    from journal.aggregates import do, load
    from journal.envelopes import AppendItem, Envelope
    from journal.exceptions import ShardsPartlyWritten
    from journal.flows import describe, start
    from journal.models import Event, Execution
    from tests.aggregate_fixtures import counter, increment

    run = arg["run"]
    wrong: list = []
    expected: dict[str, str] = {}

    def check(stream_id: str) -> None:
        where = _where(stream_id)
        expected[stream_id] = shards.shard_for(stream_id)
        if where != [expected[stream_id]]:
            wrong.append([stream_id, where, expected[stream_id]])

    for i in range(30):
        sid = f"{run}-append-{i}"
        Event.objects.append(sid, Envelope("T", {"i": i}))
        Event.objects.append(sid, Envelope("T", {"i": i}), expected_seq=0)
        check(sid)
    for i in range(10):
        sid = f"{run}-open-{i}"
        token, _ = Event.objects.open_stream(sid, Envelope("T", {}))
        Event.objects.append(sid, Envelope("T", {}), fence_token=token)
        check(sid)
    batch = [f"{run}-batch-{i}" for i in range(20)]
    captured = {alias: CaptureQueriesContext(connections[alias]) for alias in shards.shards()}
    for ctx in captured.values():
        ctx.__enter__()
    Event.objects.append_batch([AppendItem.build(sid, [Envelope("T", {})]) for sid in batch])
    for ctx in captured.values():
        ctx.__exit__(None, None, None)
    statements = {alias: sum(1 for q in ctx.captured_queries if "journal_event" in q["sql"])
                  for alias, ctx in captured.items()}
    for sid in batch:
        check(sid)
    # A batch refused on one shard is still written on the other: each shard's part is all or nothing.
    by_shard: dict[str, list[str]] = {}
    for sid in batch:
        by_shard.setdefault(shards.shard_for(sid), []).append(sid)
    bad, good = by_shard[shards.shards()[0]][0], by_shard[shards.shards()[1]][0]
    partly = None
    try:
        Event.objects.append_batch([AppendItem.build(bad, [Envelope("T", {})], None, 99),
                                    AppendItem.build(good, [Envelope("T", {})])])
    except ShardsPartlyWritten as exc:
        partly = {"refused": sorted(exc.errors), "written": sorted(exc.appended),
                  "bad_tip": Event.objects.tip(bad), "good_tip": Event.objects.tip(good)}
    # A bad payload anywhere in a batch over both shards: refused before either shard is written.
    from journal.exceptions import InvalidPayload

    fresh = [f"{run}-bad-{i}" for i in range(6)]
    try:
        Event.objects.append_batch([AppendItem.build(sid, [Envelope("T", {"x": float("nan") if i == 5 else i})])
                                    for i, sid in enumerate(fresh)])
        invalid = "written"
    except InvalidPayload:
        invalid = sorted({a for sid in fresh for a in _where(sid)})
    # The coalescer: one per shard, each statement of one shard's streams only.
    from django.test import override_settings

    from journal import coalesce

    co = [f"{run}-co-{i}" for i in range(24)]
    with override_settings(LOOM_COALESCE=True):
        threads = [threading.Thread(target=coalesce.append_item, args=(AppendItem.build(sid, [Envelope("T", {})]),))
                   for sid in co]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        coalescers = sorted(a for a in shards.shards() if coalesce.running(a) is not None)
        coalesce.close_shared()
    for sid in co:
        check(sid)
    flows = []
    for i in range(12):
        eid = f"{run}-flow-{i}"
        outcome = start("shards.one", i, execution_id=eid)
        check(eid)
        headers = [a for a in shards.shards() if Execution.objects.using(a).filter(pk=eid).exists()]
        flows.append([outcome.status, outcome.result == i, headers == [shards.shard_for(eid)],
                      describe(eid)["status"]])
    aggregates = []
    for i in range(12):
        aid = f"{run}-agg-{i}"
        do(increment, aid, Increment(by=2))
        do(increment, aid, Increment(by=3))
        check(counter.stream(aid))
        aggregates.append(load(counter, aid, fresh=True).state.count)
    return {"wrong": wrong, "statements": statements, "partly": partly, "flows": flows, "aggregates": aggregates,
            "spread": sorted({v for v in expected.values()}), "invalid": invalid, "coalescers": coalescers}


def tenants(arg) -> dict:
    """With LOOM_SHARD_KEY = journal.shards.prefix_key a tenant's streams share its shard."""
    from journal import shards
    from journal.envelopes import Envelope
    from journal.models import Event

    out = {}
    for t in range(16):
        tenant = f"{arg['run']}t{t}"
        places = set()
        for i in range(6):
            sid = f"{tenant}/order-{i}"
            Event.objects.append(sid, Envelope("T", {}))
            places.update(_where(sid))
        out[tenant] = [sorted(places), shards.shard_for(tenant)]
    return out


def grow(arg) -> dict:
    """Phase "before": streams on one shard. Phase "after" (two shards, LOOM_SHARD_HISTORY=1): the old
    streams are found where they are, their ids cannot be opened twice, new streams use both shards."""
    from journal import shards
    from journal.envelopes import Envelope
    from journal.exceptions import StreamExists
    from journal.flows import ExecutionExists, start
    from journal.models import Event

    run = arg["run"]
    old = [f"{run}-old-{i}" for i in range(24)]
    if arg["phase"] == "before":
        for sid in old:
            Event.objects.open_stream(sid, Envelope("T", {}))
        start("shards.one", 1, execution_id=f"{run}-oldflow")
        return {"shards": shards.shards(), "where": {sid: _where(sid) for sid in old}}
    moved_placement = [sid for sid in old if shards.placements(sid)[0] != shards.shards()[0]]
    found = {sid: shards.shard_for(sid) for sid in old}
    refused = 0
    for sid in old:
        Event.objects.append(sid, Envelope("T", {"after": True}))
        try:
            Event.objects.open_stream(sid, Envelope("T", {}))
        except StreamExists:
            refused += 1
    try:
        start("shards.one", 2, execution_id=f"{run}-oldflow")
        again = "started twice"
    except ExecutionExists:
        again = "refused"
    new = [f"{run}-new-{i}" for i in range(24)]
    for sid in new:
        Event.objects.append(sid, Envelope("T", {}))
    return {"moved_placement": len(moved_placement), "found": sorted(set(found.values())),
            "old_where": sorted({a for sid in old for a in _where(sid)}), "refused": refused, "again": again,
            "old_tips": sorted({Event.objects.tip(sid) for sid in old}),
            "new_where": sorted({a for sid in new for a in _where(sid)}),
            "new_right": all(_where(sid) == [shards.shard_for(sid)] for sid in new)}


def together(arg) -> dict:
    """A flow, an aggregate and a projection, each on both shards; the projection's one read model."""
    from django.db import DEFAULT_DB_ALIAS, connections

    from benchmarks.domains.counter import Increment
    from journal import shards
    from journal.aggregates import do, load
    from journal.flows import start
    from projections.service import drain
    from tests.aggregate_fixtures import counter, increment

    run = arg["run"]
    eids = ids_on_each_shard(f"{run}-flow", 2)
    outcomes = {eid: start("shards.steps", {"n": 3}, execution_id=eid).status for eid in eids}
    aids = ids_on_each_shard(f"{run}-agg", 2, counter.stream)
    for aid in aids:
        for _ in range(3):
            do(increment, aid, Increment(by=1))
    states = {aid: load(counter, aid, fresh=True).state.count for aid in aids}
    drain()
    with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
        cursor.execute("SELECT stream, count(*) FROM test_shard_seen WHERE stream LIKE %s GROUP BY stream",
                       [f"%{run}-agg%"])
        seen = dict(cursor.fetchall())
    return {"outcomes": outcomes, "flow_shards": {e: shards.shard_for(e) for e in eids}, "states": states,
            "agg_shards": sorted({shards.shard_for(counter.stream(a)) for a in aids}), "seen": seen,
            "effects": effects(eids)}


def ids_on_each_shard(prefix: str, per_shard: int, stream=lambda i: i) -> list[str]:
    """Ids whose streams fall on each shard, `per_shard` of each (hash placement)."""
    from journal import shards

    want = {alias: [] for alias in shards.shards()}
    i = 0
    while any(len(v) < per_shard for v in want.values()):
        candidate = f"{prefix}-{i}"
        bucket = want[shards.shard_for(stream(candidate))]
        if len(bucket) < per_shard:
            bucket.append(candidate)
        i += 1
    return [x for v in want.values() for x in v]


def effects(eids: list[str]) -> dict:
    """Effect rows per execution and step, read on each execution's shard."""
    from django.db import connections

    from journal import shards

    out = {}
    for eid in eids:
        with connections[shards.shard_for(eid)].cursor() as cursor:
            cursor.execute("SELECT step, count(*) FROM test_shard_effects WHERE execution_id = %s GROUP BY step",
                           [eid])
            out[eid] = dict(cursor.fetchall())
    return out


def owner(arg) -> dict:
    """A worker that owns gated runs on both shards: its services run, the runs start in threads with eager
    leases; prints `leased` once every run's lease row exists, then waits (to be SIGKILLed), or, with
    `exit_after`, exits once its runs ended."""
    from journal import shards
    from journal.flows import start
    from leases.models import Lease
    from leases.worker import Worker

    worker = Worker(arg["id"])
    worker.start()
    ended: dict = {}

    def run(eid: str) -> None:
        try:
            ended[eid] = start("shards.steps", {"n": arg["n"], "gate": arg["gate"]}, execution_id=eid).status
        except Exception as exc:  # a shard went away under the run
            ended[eid] = type(exc).__name__

    threads = [threading.Thread(target=run, args=(eid,), daemon=True) for eid in arg["eids"]]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if all(Lease.objects.using(shards.shard_for(e)).filter(execution_id=e).exists() for e in arg["eids"]):
            break
        time.sleep(0.05)
    print(json.dumps({"leased": True}), flush=True)
    if not arg.get("exit_after"):
        threading.Event().wait()
    for thread in threads:
        thread.join(120)
    worker.stop(2)
    return {"ended": ended}


def status(arg) -> dict:
    """Status, completed-step events and effects of executions (each read on its own shard)."""
    from journal import shards
    from journal.models import Event, Execution

    out = {}
    for eid in arg["eids"]:
        alias = shards.shard_for(eid)
        header = Execution.objects.using(alias).filter(pk=eid).values_list("status", flat=True).first()
        completed = list(Event.objects.using(alias).filter(stream_id=eid, type="STEP_COMPLETED")
                         .values_list("payload__step", flat=True))
        out[eid] = {"status": header, "completed": sorted(completed), "shard": alias}
    return {"executions": out, "effects": effects(arg["eids"])}


def shard0_only(arg) -> dict:
    """With shard1's server down: everything on shard0 works; shard1's streams fail with a database error."""
    from benchmarks.domains.counter import Increment
    from journal import shards
    from journal.aggregates import do, load
    from journal.envelopes import Envelope
    from journal.flows import start
    from journal.models import Event
    from tests.aggregate_fixtures import counter, increment

    first, second = shards.shards()[:2]
    run = arg["run"]
    eids = [e for e in ids_on_each_shard(f"{run}-down", 3) if shards.shard_for(e) == first]
    flows = {e: start("shards.steps", {"n": 2}, execution_id=e).status for e in eids}
    aid = next(a for a in ids_on_each_shard(f"{run}-dagg", 1, counter.stream)
               if shards.shard_for(counter.stream(a)) == first)
    do(increment, aid, Increment(by=5))
    sid = next(s for s in ids_on_each_shard(f"{run}-dapp", 1) if shards.shard_for(s) == first)
    Event.objects.append(sid, Envelope("T", {}))
    elsewhere = next(s for s in ids_on_each_shard(f"{run}-dx", 1) if shards.shard_for(s) == second)
    try:
        start("shards.one", 1, execution_id=elsewhere)
        failed = None
    except Exception as exc:
        failed = type(exc).__name__
    return {"flows": flows, "aggregate": load(counter, aid, fresh=True).state.count, "tip": Event.objects.tip(sid),
            "shard1_start": failed, "effects": effects(eids)}


def pooled(arg) -> dict:
    """Through PgBouncer in transaction pooling: appends, a flow, an aggregate, many threads at once."""
    from django.db import connections

    from benchmarks.domains.counter import Increment
    from journal.aggregates import do, load
    from journal.envelopes import Envelope
    from journal.flows import start
    from journal.models import Event
    from journal.store.postgres import behind_pooler, may_prepare
    from tests.aggregate_fixtures import counter, increment

    run = arg["run"]
    errors: list[str] = []

    def work(t: int) -> None:
        try:
            for i in range(20):
                Event.objects.append(f"{run}-p{t}", Envelope("T", {"i": i}))
            start("shards.one", t, execution_id=f"{run}-f{t}")
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            connections.close_all()

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for _ in range(5):
        do(increment, f"{run}-a", Increment(by=1))
    return {"errors": errors, "tips": sorted({Event.objects.tip(f"{run}-p{t}") for t in range(8)}),
            "flows": sorted({Event.objects.tip(f"{run}-f{t}") for t in range(8)}),
            "aggregate": load(counter, f"{run}-a", fresh=True).state.count,
            "pooled": behind_pooler(connections["default"]), "prepares": may_prepare(connections["default"])}


def _pooler_servers(pooler: str) -> set[int]:
    """The backend pids of PgBouncer's server connections (its admin console, scripts/shard-servers): a LISTEN
    session among them would have gone through the pooler."""
    import psycopg

    host, port = pooler.rsplit(":", 1)
    with psycopg.connect(host=host, port=int(port), dbname="pgbouncer", user="postgres", autocommit=True,
                         cursor_factory=psycopg.ClientCursor) as conn:
        cursor = conn.execute("SHOW SERVERS")
        column = [c.name for c in cursor.description].index("remote_pid")
        return {row[column] for row in cursor.fetchall()}


def _listen_sessions(direct, channel: str) -> list[int]:
    """The pids of the sessions LISTENing on `channel` of this database, read on the server itself."""
    rows = direct.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query = %s",
                          [f'LISTEN "{channel}"']).fetchall()
    return sorted(row[0] for row in rows)


def _within(condition, bound: float) -> bool:
    """Whether `condition()` held within `bound` seconds (a bound, not a timing claim)."""
    give_up = time.monotonic() + bound
    while not condition():
        if time.monotonic() > give_up:
            return False
        time.sleep(0.05)
    return True


def pooled_listeners(arg) -> dict:
    """The application's alias on PgBouncer (transaction pooling) with POOLER_PORTS: every LISTEN of the
    runtime goes to the server itself (LOOM_DIRECT). The polls are 30 s and every wait is bounded at 10 s,
    so what completes in time was woken by a notification: a flow parked in recv woken by the waker's
    LISTEN, a get_event caller woken by the process's get_event listener, a new enqueue picked up by the
    queue dispatcher's LISTEN. With `no_direct`, the alias has no LOOM_DIRECT (polls short instead): each
    falls back to polling, no LISTEN session exists, and nothing hangs."""
    import logging
    from types import SimpleNamespace

    import psycopg
    from django.db import connections

    from journal import conf
    from journal.flows import event_listener, get_event, send, start
    from journal.listen import direct_address
    from journal.models import Execution
    from journal.store.postgres import behind_pooler
    from leases.waker import WakeService
    from queues import declare_queue, enqueue
    from queues.service import QueueService

    run, bound = arg["run"], arg["bound"]
    # Without LOOM_DIRECT no session is expected: a second is enough to see none appear.
    listening_bound = 1.0 if arg.get("no_direct") else bound
    settings_dict = connections["default"].settings_dict
    if arg.get("no_direct"):
        settings_dict.pop("LOOM_DIRECT", None)
    said: list[str] = []

    class Said(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said.append(record.getMessage())

    handler = Said(logging.WARNING)
    logging.getLogger("loom").addHandler(handler)
    server = f"{settings_dict['HOST']}:{arg['direct_port']}"
    direct = psycopg.connect(host=settings_dict["HOST"], port=arg["direct_port"], dbname=settings_dict["NAME"],
                             user=settings_dict["USER"], autocommit=True)
    waits, queued = conf.get("LOOM_WAIT_CHANNEL"), conf.get("LOOM_QUEUE_CHANNEL")

    def sessions(channel: str) -> dict:
        pids = _listen_sessions(direct, channel)
        return {"count": len(pids), "via_pooler": bool(set(pids) & _pooler_servers(arg["pooler"]))}

    def completed(eid: str) -> bool:
        return Execution.objects.filter(pk=eid, status="completed").exists()

    facts: dict = {"pooled": behind_pooler(connections["default"]), "direct": direct_address("default"),
                   "server": server}
    waker, dispatcher = WakeService(), QueueService()
    try:
        # (2) the waker of parked executions: idle (nothing due, a 30 s poll), then a message to a parked recv.
        waker.start(SimpleNamespace(worker_id=f"{run}-waker"))
        facts["waker_listening"] = _within(lambda: sessions(waits)["count"] >= 1, listening_bound)
        facts["waker_session"] = sessions(waits)
        time.sleep(0.5)  # its first claim found nothing: it sleeps its poll now
        parked = f"{run}-parked"
        facts["parked"] = start("shards.recv", {}, execution_id=parked).status
        send(parked, "go", "by the waker")
        facts["parked_woken"] = _within(lambda: completed(parked), bound)

        # (1) a get_event caller, woken through the process's listener by the set_event of the flow it waits on.
        caller = f"{run}-caller"
        start("shards.recv", {}, execution_id=caller)
        got: list = []
        thread = threading.Thread(target=lambda: (got.append(get_event(caller, "got", timeout=bound, default="unset")),
                                                  connections.close_all()))
        thread.start()
        listener = event_listener.listener_for("default")
        facts["caller_waiting"] = _within(lambda: listener.waiting() == 1, bound)
        facts["get_event_listening"] = _within(lambda: listener.connected and sessions(waits)["count"] >= 2,
                                               listening_bound)
        facts["get_event_sessions"] = sessions(waits)
        send(caller, "go", "to the caller")
        thread.join(bound + 30)
        facts["got"] = got

        # (3) the queue dispatcher: idle (30 s polls), then an enqueue.
        declare_queue(f"{run}-q", concurrency=1)
        dispatcher.start(SimpleNamespace(worker_id=f"{run}-dispatcher"))
        facts["dispatcher_listening"] = _within(lambda: sessions(queued)["count"] >= 1, listening_bound)
        facts["dispatcher_session"] = sessions(queued)
        time.sleep(0.5)  # its first pass found nothing: idle now
        entry = enqueue("shards.one", 7, queue=f"{run}-q").execution_id
        facts["enqueued_started"] = _within(lambda: completed(entry), bound)
    finally:
        stopped = time.monotonic()
        dispatcher.stop(5)
        waker.stop(5)
        event_listener.close_shared()
        facts["stopped_within"] = time.monotonic() - stopped < 30
        logging.getLogger("loom").removeHandler(handler)
        direct.close()
        connections.close_all()
    facts["said"] = said
    return facts


def admin_pages(arg) -> dict:
    """The executions list merges every shard (count, pages, order); an execution's page and its action views
    read its own shard."""
    import re

    from django.contrib.auth import get_user_model
    from django.test import Client

    from journal import shards
    from journal.flows import start

    run = arg["run"]
    eids = ids_on_each_shard(run, 30)
    for eid in eids:
        start("shards.one", 1, execution_id=eid)
    user, _ = get_user_model().objects.get_or_create(username=f"{run}-admin", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(user)
    listed: list[str] = []
    for page in (1, 2):
        html = client.get("/admin/journal/execution/", {"q": run, "p": page}).content.decode()
        listed += re.findall(rf'href="/admin/journal/execution/({re.escape(run)}-\d+)/change/', html)
    counted = re.search(r"(\d+) executions", html)
    one = next(e for e in eids if shards.shard_for(e) == shards.shards()[1])
    page = client.get(f"/admin/journal/execution/{one}/change/")
    confirm = client.get(f"/admin/journal/execution/{one}/cancel/")
    # Every other list of a sharded model answers too, with each shard's rows (the fences of this run's ids).
    from django.contrib import admin
    from django.urls import reverse

    lists = {}
    for model in admin.site._registry:
        if shards.ShardRouter.routes(model):
            url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
            lists[model._meta.label] = client.get(url).status_code
    fences = client.get("/admin/journal/fence/", {"q": run}).content.decode()
    # Issue #28: a search by an input value finds executions on every shard (the admin and the CLI), and the
    # API's list merges them.
    import io
    import json

    from django.core.management import call_command

    marked = ids_on_each_shard(f"{run}m", 1)  # one id on each shard
    for eid in marked:
        start("shards.one", {"order": f"{run}-needle"}, execution_id=eid)
    html = client.get("/admin/journal/execution/", {"q": f"{run}-needle"}).content.decode()
    searched = re.findall(rf'href="/admin/journal/execution/({re.escape(run)}m-\d+)/change/', html)
    out = io.StringIO()
    call_command("loom", "executions", "list", "--search", f"{run}-needle", "--json", stdout=out)
    return {"listed": listed, "distinct": len(set(listed)), "expected": sorted(eids), "count": counted and counted[1],
            "page": page.status_code, "names_flow": "shards.one" in page.content.decode(),
            "confirm": confirm.status_code, "lists": lists,
            "fences": sorted(set(re.findall(rf"({re.escape(run)}-\d+)", fences))),
            "searched": sorted(set(searched)), "searched_cli": sorted(r["id"] for r in json.loads(out.getvalue())),
            "marked": sorted(marked), "marked_shards": [shards.shard_for(e) for e in marked]}


def admin_rows_per_shard(arg) -> dict:
    """Leases, workers, subscriptions and checkpoints on both shards, with ids that repeat across them: every
    list shows both shards' rows with their shard, a shard1 row's page reads shard1, and the unblock action
    (ticked in the list; clicked in headless Chromium when it is installed) unblocks the shard1 row only."""
    import re

    from django.contrib.auth import get_user_model
    from django.test import Client

    from journal import shards
    from journal.envelopes import Envelope
    from journal.models import Event
    from leases.models import Lease, Worker
    from leases.store import store_for as lease_store
    from projections.models import Checkpoint, Subscription

    run = arg["run"]
    shared_sub = 900_000 + len(run)  # the same subscription id on both shards
    eids = ids_on_each_shard(f"{run}-lease", 2)
    for alias in shards.shards():
        # One worker id on both shards (a worker registers on each), told apart by its host.
        Worker.objects.using(alias).update_or_create(id=f"{run}-w", defaults={"host": f"host-on-{alias}", "pid": 1})
        Subscription.objects.using(alias).update_or_create(
            id=shared_sub, defaults={"consumer": f"{run}-c", "stream": f"{run}-stream-on-{alias}", "blocked": True,
                                     "error": f"boom on {alias}", "at": 0, "tip": 3})
        Checkpoint.objects.using(alias).update_or_create(consumer=f"{run}-c", defaults={"position": 7})
    for eid in eids:  # a lease at the stream's fence, taken through the lease store on the stream's shard
        alias = shards.shard_for(eid)
        if not Lease.objects.using(alias).filter(execution_id=eid).exists():
            token, _ = Event.objects.open_stream(eid, Envelope("T", {}))
            lease_store(alias).acquire_many(f"{run}-w", [(eid, token)], ttl=3600)
    user, _ = get_user_model().objects.get_or_create(username=f"{run}-admin", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(user)

    def shards_listed(url: str, q: str) -> list[str]:
        html = client.get(url, {"q": q}).content.decode()
        return sorted(re.findall(r'class="field-shard">([^<]*)<', html))

    lists = {
        "leases": shards_listed("/admin/leases/lease/", f"{run}-lease"),
        "workers": shards_listed("/admin/leases/worker/", f"{run}-w"),
        "subscriptions": shards_listed("/admin/projections/subscription/", f"{run}-c"),
        "checkpoints": shards_listed("/admin/projections/checkpoint/", f"{run}-c"),
    }
    workers_html = client.get("/admin/leases/worker/", {"q": f"{run}-w"}).content.decode()
    links = sorted(set(re.findall(rf'href="(/admin/leases/worker/{re.escape(run)}-w/change/\?[^"]*)"', workers_html)))
    other = shards.shards()[1]
    worker_page = client.get(f"/admin/leases/worker/{run}-w/change/", {"shard": other}).content.decode()
    sub_page = client.get(f"/admin/projections/subscription/{shared_sub}/change/", {"shard": other})
    lease_one = next(e for e in eids if shards.shard_for(e) == other)
    lease_page = client.get(f"/admin/leases/lease/{lease_one}/change/")  # no ?shard=: found on its shard
    checkpoint_page = client.get(f"/admin/projections/checkpoint/{run}-c/change/", {"shard": other})
    pages = {
        "worker": worker_page.count(f"host-on-{other}"), "worker_default": worker_page.count("host-on-default"),
        "worker_leases": sorted(set(re.findall(rf"({re.escape(run)}-lease-\d+)", worker_page))),
        "subscription": sub_page.status_code, "sub_stream": f"{run}-stream-on-{other}" in sub_page.content.decode(),
        "sub_default": f"{run}-stream-on-default" in sub_page.content.decode(),
        "lease": lease_page.status_code, "checkpoint": checkpoint_page.status_code,
    }
    subs_html = client.get("/admin/projections/subscription/", {"q": f"{run}-c"}).content.decode()
    boxes = sorted(re.findall(r'name="_selected_action" value="([^"]*)"', subs_html))
    clicked = click_unblock(client, f"{run}-c", f"{other}:{shared_sub}") if arg.get("browser") else None
    if clicked is None:
        client.post("/admin/projections/subscription/?q=" + f"{run}-c",
                    {"action": "unblock", "_selected_action": [f"{other}:{shared_sub}"], "index": 0})
    blocked = {alias: Subscription.objects.using(alias).get(id=shared_sub).blocked for alias in shards.shards()}
    return {"lists": lists, "links": links, "pages": pages, "boxes": boxes, "blocked": blocked, "clicked": clicked,
            "lease_shards": sorted({shards.shard_for(e) for e in eids})}


def admin_queue_entries(arg) -> dict:
    """The queue page over two shards (issue 24): entries of both shards listed with their shard, each checkbox
    naming its row's shard; cancel and reprioritise act on the rows ticked, each on its own shard, never on
    another shard's entry (entry ids repeat across shards: each shard numbers its own)."""
    import re

    from django.contrib.auth import get_user_model
    from django.test import Client

    import queues
    from journal import shards
    from queues.models import QueueEntry

    run = arg["run"]
    queue = f"{run}-q"
    queues.declare_queue(queue, concurrency=2)
    eids = ids_on_each_shard(f"{run}-e", 2)
    for eid in eids:
        queues.enqueue("shards.one", 1, queue=queue, execution_id=eid)
    user, _ = get_user_model().objects.get_or_create(username=f"{run}-admin", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(user)
    url = f"/admin/queues/queueentry/?queue={queue}&state=live"
    html = client.get(url).content.decode()
    other = shards.shards()[1]
    on = {alias: [e for e in eids if shards.shard_for(e) == alias] for alias in shards.shards()}

    def box(alias: str, eid: str) -> str:
        return f"{alias}:{QueueEntry.objects.using(alias).get(execution_id=eid).pk}"

    def act(action: str, picked: str, **extra) -> list[str]:
        page = client.post(url, {"action": action, "_selected_action": [picked], "post": "yes", **extra}, follow=True)
        return re.findall(r'<li class="[a-z]+">(.*?)</li>', page.content.decode())

    cancelled = act("cancel_entries", box(other, on[other][0]))
    reprioritised = act("reprioritise_entries", box("default", on["default"][0]), priority="42")
    rows = {eid: QueueEntry.objects.using(shards.shard_for(eid)).values_list("state", "priority").get(execution_id=eid)
            for eid in eids}
    return {"listed": sorted(re.findall(r'class="field-shard">([^<]*)<', html)),
            "boxes": sorted(re.findall(r'name="_selected_action" value="([^"]*)"', html)),
            "expected_boxes": sorted(box(shards.shard_for(e), e) for e in eids), "on": on,
            "cancelled": cancelled, "reprioritised": reprioritised, "rows": rows}


def click_unblock(client, query: str, box: str) -> str | None:
    """Tick `box` on the subscriptions list in headless Chromium (no JavaScript) against a live server of this
    process (its two shards), choose "Unblock" and press Go: the page's message, or None without a browser."""
    import os
    import threading
    from pathlib import Path

    from django.core.handlers.wsgi import WSGIHandler
    from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler

    chromium = Path("/usr/bin/chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if not chromium.exists():
        return None

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args) -> None:
            pass

    server = ThreadedWSGIServer(("127.0.0.1", 0), Quiet)
    server.set_app(WSGIHandler())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # Playwright's loop in this thread; the ORM beside it
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(chromium), args=[
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
            context = browser.new_context(java_script_enabled=False)
            context.add_cookies([{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": url}])
            page = context.new_page()
            page.goto(f"{url}/admin/projections/subscription/?q={query}")
            page.check(f'input[name="_selected_action"][value="{box}"]')
            page.select_option('select[name="action"] >> nth=0', "unblock")
            with page.expect_navigation():  # the click returns before the answer has loaded
                page.click('button[name="index"][value="0"], input[name="index"][value="0"]')
            text = page.inner_text("ul.messagelist") if page.query_selector("ul.messagelist") else page.content()
            browser.close()
            return text
    finally:
        server.shutdown()
        server.server_close()


def queues_over_shards(arg) -> dict:
    """Queues, schedules, the CLI and Django Tasks over two shards: an entry lives on its execution's shard
    (a partition's and a dedup id's on that key's shard), one dispatcher runs every shard's entries, the
    stats add up the shards, a schedule's row stays on one database while its ticks land on their shards,
    `manage.py loom` lists both shards and acts on an execution's own, get_result reads the task's shard."""
    import io
    from datetime import timedelta
    from types import SimpleNamespace

    from django.core.management import CommandError, call_command
    from django.db import connections
    from django.utils import timezone

    import queues
    from journal import shards
    from journal.models import Execution
    from leases import schedules
    from leases.models import Schedule
    from queues.models import QueueEntry
    from queues.service import QueueService
    from tests import queue_flows

    run = arg["run"]
    queues.declare_queue(f"{run}-q", concurrency=2, partition_concurrency=1)
    queue = f"{run}-q"

    def homes(eid: str) -> list[str]:
        return [a for a in shards.shards() if QueueEntry.objects.using(a).filter(execution_id=eid).exists()]

    eids = ids_on_each_shard(f"{run}-e", 3)
    placed = {eid: homes(queues.enqueue("shards.one", 7, queue=queue, execution_id=eid).execution_id) == [
        shards.shard_for(eid)] for eid in eids}
    partition = [queues.enqueue("shards.one", i, queue=queue, partition_key=f"{run}-tenant").execution_id
                 for i in range(6)]
    partition_homes = sorted({a for eid in partition for a in homes(eid)})
    first = queues.enqueue("shards.one", 1, queue=queue, dedup_id=f"{run}-once")
    second = queues.enqueue("shards.one", 2, queue=queue, dedup_id=f"{run}-once")
    later = next(e for e in ids_on_each_shard(f"{run}-later", 1) if shards.shard_for(e) == shards.shards()[1])
    queues.enqueue("shards.one", 0, queue=queue, execution_id=later, run_after=timezone.now() + timedelta(days=1))
    pending = {q.name: q.pending for q in queues.stats()}.get(queue)
    try:
        queues.enqueue("shards.one", 0, queue=queue, execution_id=later + "-x", using="nowhere")
        wrong_using = "accepted"
    except queues.QueueError as exc:
        wrong_using = type(exc).__name__
    cancelled = queues.cancel_pending(later)
    entry_state = queues.entry_of(later).state
    # Django Tasks: the result id is the execution id; get_result reads its shard.
    result = queue_flows.add.enqueue(2, 3)  # on the backend's queue "default"
    task_shard = shards.shard_for(result.id)
    ready = queue_flows.add.get_backend().get_result(result.id).status.name
    # One dispatcher over both shards runs everything.
    service = QueueService()
    service.start(SimpleNamespace(worker_id=f"{run}-dispatcher"))
    everything = eids + partition + [first.execution_id, result.id]
    deadline = time.monotonic() + 90
    try:
        while time.monotonic() < deadline:
            done = [eid for eid in everything
                    if Execution.objects.using(shards.shard_for(eid)).filter(pk=eid, status="completed").exists()]
            if len(done) == len(everything):
                break
            time.sleep(0.1)
    finally:
        service.stop(5)
    finished = queue_flows.add.get_backend().get_result(result.id)
    running_after = {q.name: q.running for q in queues.stats()}.get(queue)
    # A schedule: its row on the default database only, its tick's entry on the tick's shard.
    schedules.define(f"{run}-cron", "* * * * * *", "shards.one", 5, catch_up="once", queue=queue,
                     now=timezone.now() - timedelta(seconds=5))
    started = schedules.tick()
    ticks = [[one.execution_id, homes(one.execution_id), shards.shard_for(one.execution_id)] for one in started
             if one.schedule == f"{run}-cron"]
    schedule_rows = {a: "leases_schedule" in connections[a].introspection.table_names() and
                     Schedule.objects.using(a).filter(name=f"{run}-cron").exists() for a in shards.shards()}
    # manage.py loom: a list over both shards, show on an execution's own shard, a wrong --database refused.

    def loom(*args: str) -> tuple[int, object]:
        out = io.StringIO()
        try:
            call_command("loom", *args, "--json", stdout=out)
        except CommandError as exc:
            return exc.returncode, json.loads(out.getvalue() or "null")
        return 0, json.loads(out.getvalue())

    _, listed = loom("executions", "list", "--queue", queue, "--limit", "200")
    on_shard1 = next(e for e in eids if shards.shard_for(e) == shards.shards()[1])
    shown_code, shown = loom("executions", "show", on_shard1)
    refused_code, _ = loom("executions", "show", on_shard1, "--database", shards.shards()[0])
    _, queue_rows = loom("queues")
    # Start reservations stay on the default database; pruning finds each one's header on its own shard.
    from leases.store import store_for as lease_store
    from leases.tasks import prune_reservations

    reservations = lease_store("default")
    begun = [e for e in eids if shards.shard_for(e) == shards.shards()[1]][:2]
    for eid in [*begun, f"{run}-not-begun"]:
        reservations.reserve_start(eid, "shards.one", "h", "")
    pruned = [prune_reservations(), sorted(e for e in reservations.reserved_ids(100) if e.startswith(run))]
    reservations.delete_schedules(f"{run}-cron")  # an every-second schedule must not tick in later tests' workers
    return {
        "placed": placed, "partition_homes": partition_homes, "dedup": [first.created, second.created,
                                                                         first.execution_id == second.execution_id],
        "pending": pending, "wrong_using": wrong_using, "cancelled": cancelled, "entry_state": entry_state,
        "task_shard": [task_shard, homes(result.id)], "ready": ready, "finished": finished.status.name,
        "return_value": finished.return_value, "done": len(done), "everything": len(everything),
        "running_after": running_after, "ticks": ticks, "schedule_rows": schedule_rows,
        "listed": sorted({(row["id"], row["shard"]) for row in listed if row["id"] in eids}),
        "expected_listed": sorted((eid, shards.shard_for(eid)) for eid in eids),
        "shown": [shown_code, shown.get("shard"), shown.get("status"), shown.get("queue", {}).get("queue")],
        "refused": refused_code,
        "queue_row": next(([r["pending"], r["running"]] for r in queue_rows if r["name"] == queue), None),
        "pruned": pruned,
    }


def privacy_over_shards(arg) -> dict:
    """Personal data over two shards: a subject's data sealed on both shards with each shard's key, a queued
    start's sealed input unsealed on its execution's shard, and one forget tombstoning it on both."""
    from django.db import connections

    from journal import shards
    from journal.envelopes import Envelope
    from journal.flows import describe, start
    from journal.flows.runtime import seal_started
    from journal.models import DataKey, Event
    from journal.privacy import FORGOTTEN, forget
    from tests import privacy_fixtures  # noqa: F401  (PrivacyOrder, test.privacy.signup)

    run = arg["run"]
    subject, only0 = f"{run}-ann", f"{run}-bob"
    streams = ids_on_each_shard(f"{run}-o", 1)
    for sid in streams:
        Event.objects.append(sid, Envelope("PrivacyOrder", {"customer_id": subject, "email": "ann@example.org"}))
    first = next(s for s in streams if shards.shard_for(s) == shards.shards()[0])
    second = next(s for s in streams if shards.shard_for(s) == shards.shards()[1])
    Event.objects.append(first, Envelope("PrivacyOrder", {"customer_id": only0, "email": "bob@example.org"}))
    queued = next(e for e in ids_on_each_shard(f"{run}-q", 1) if shards.shard_for(e) == shards.shards()[1])
    with shards.on_stream(queued):  # as leases.tasks.reserve_and_enqueue seals a queued start's input
        sealed = seal_started("test.privacy.signup", {"customer_id": subject, "email": "ann@example.org"})
    status = start("test.privacy.signup", sealed, execution_id=queued).status

    def clear_on(alias: str) -> bool:
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT count(*) FROM journal_event WHERE payload::text LIKE %s", ["%ann@example.org%"])
            return cursor.fetchone()[0] > 0

    def keys_held(who: str) -> dict:
        return {a: DataKey.objects.using(a).filter(subject=who).values_list("wrapped", flat=True).first() is not None
                for a in shards.shards()}

    before = {"reads": [Event.objects.read(s)[0].payload["email"] for s in streams],
              "input": describe(queued)["input"]["email"], "status": status,
              "clear": [clear_on(a) for a in shards.shards()], "keys": keys_held(subject)}
    forget(subject, by="dpo")
    forget(only0, by="dpo")
    Event.objects.append(second, Envelope("PrivacyOrder", {"customer_id": only0, "email": "bob@example.org"}))
    after = {"reads": [Event.objects.read(s)[0].payload["email"] for s in streams],
             "input": describe(queued)["input"]["email"],
             "tombstones": {who: {a: DataKey.objects.using(a).filter(subject=who, wrapped__isnull=True).exists()
                                  for a in shards.shards()} for who in (subject, only0)},
             "bob_on_second": Event.objects.read(second)[-1].payload["email"],
             "forgotten": FORGOTTEN}
    return {"before": before, "after": after}


def waits_over_shards(arg) -> dict:
    """Flows that wait over two shards: one waker service runs every shard's due waits; send, get_event,
    wake_now, suspend and fork act on the execution's shard; a chain's runs and a default child stay on
    their root's shard; a child with an id on the other shard wakes its parent after its settle."""
    from types import SimpleNamespace

    from journal import shards
    from journal.flows import fork, get_event, send, start, suspend, waiting_on, wake_now
    from journal.flows.waits import chain_current
    from journal.models import Execution
    from leases.waker import WakeService

    run = arg["run"]

    def status(eid: str) -> tuple:
        where = [a for a in shards.shards() if Execution.objects.using(a).filter(pk=eid).exists()]
        header = Execution.objects.using(shards.shard_for(eid)).filter(pk=eid).values_list("status", "result").first()
        return (where, shards.shard_for(eid), header[0] if header else None, header[1] if header else None)

    receivers = ids_on_each_shard(f"{run}-r", 2)
    parked = {eid: start("shards.recv", {}, execution_id=eid).status for eid in receivers}
    waits = {eid: (waiting_on(eid) or {}).get("kind") for eid in receivers}
    parents = ids_on_each_shard(f"{run}-p", 1)
    for eid in parents:
        start("shards.parent", {"n": 3}, execution_id=eid)
    first, second = shards.shards()[:2]
    cross_parent = next(e for e in ids_on_each_shard(f"{run}-x", 1) if shards.shard_for(e) == first)
    cross_child = next(e for e in ids_on_each_shard(f"{run}-xc", 1) if shards.shard_for(e) == second)
    start("shards.parent", {"n": 4, "child": cross_child}, execution_id=cross_parent)
    chain = next(e for e in ids_on_each_shard(f"{run}-c", 1) if shards.shard_for(e) == second)
    start("shards.chain", {"n": 0, "until": 3}, execution_id=chain)
    service = WakeService()
    service.start(SimpleNamespace(worker_id=f"{run}-waker"))
    try:
        by_send, by_wake, to_suspend = receivers[0], receivers[1], receivers[2]
        send(by_send, "go", {"x": 1})
        got = get_event(by_send, "got", timeout=60)
        woken = wake_now(by_wake)
        suspended = suspend(to_suspend).status
        deadline = time.monotonic() + 90
        watched = [by_send, by_wake, *parents, cross_parent]
        while time.monotonic() < deadline:
            if all(status(e)[2] == "completed" for e in watched) and status(chain_current(chain))[2] == "completed":
                break
            time.sleep(0.2)
        forked = fork(by_send, 0)  # read on the original's shard, written on the new id's
    finally:
        service.stop(5)
    last = chain_current(chain)
    return {
        "parked": parked, "waits": waits, "got": got, "woken": woken, "suspended": [suspended, status(to_suspend)],
        "receivers": {e: status(e) for e in (by_send, by_wake)},
        "parents": {e: status(e) for e in parents},
        "children": {e: status(f"{e}.child-0") for e in parents},
        "cross": [status(cross_parent), status(cross_child)],
        "chain": [last, status(last), [status(f"{chain}~{k}")[0] for k in (1, 2)]],
        "fork": status(forked)[:2], "woken_count": service.woken,
    }


def _admin_client(run: str):
    from django.contrib.auth import get_user_model
    from django.test import Client

    user, _ = get_user_model().objects.get_or_create(username=f"{run}-admin", is_staff=True, is_superuser=True)
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


def _consumers(html: str, run: str) -> list[str]:
    """The consumers listed in a subscriptions page's result table, in order."""
    import re

    table = html.split('id="result_list"')[1].split("</table>")[0] if 'id="result_list"' in html else ""
    return re.findall(rf">({re.escape(run)}-[a-zA-Z]+-\d{{3}})<", table)


def admin_merged_list(arg) -> dict:
    """The subscriptions list over two shards, ordered by consumer (text): more rows on shard1 than on default
    (its later pages exist only in the merge), consumers "a-", "B-" on shard1 and "c-" on default (a linguistic
    collation puts a before B, bytes B before a). Every page opens and lists each row once; the default shard
    is counted once; a page past the depth cap says so; the action bar shows when only shard1 has rows; a
    shard1 row's History link opens shard1's row."""
    import re

    from django.db import connections, transaction
    from django.test.utils import CaptureQueriesContext

    from journal import shards
    from projections.admin import SubscriptionAdmin
    from projections.models import Subscription

    run = arg["run"]
    default, other = shards.shards()
    collations = {alias: connections[alias].cursor().execute(
        "SELECT datcollate, datlocprovider::text, coalesce(daticulocale, '') FROM pg_database "
        "WHERE datname = current_database()").fetchone() for alias in (default, other)}
    Subscription.objects.using(default).bulk_create(
        [Subscription(consumer=f"{run}-c-{i:03}", stream="s") for i in range(120)])
    Subscription.objects.using(other).bulk_create(
        [Subscription(consumer=f"{run}-{p}-{i:03}", stream="s") for p in ("a", "B") for i in range(110)])
    client = _admin_client(run)
    pages, listed = {}, []
    for number in (1, 2, 3, 4):
        response = client.get("/admin/projections/subscription/", {"q": run, "p": number})
        pages[number] = [response.status_code, response.get("Location")]
        listed += _consumers(response.content.decode(), run) if response.status_code == 200 else []
    first = client.get("/admin/projections/subscription/", {"q": run}).content.decode()
    counted = re.search(r"(\d+) subscriptions?", first)
    with CaptureQueriesContext(connections[default]) as queries:
        client.get("/admin/projections/subscription/")
    counts = sum(1 for q in queries.captured_queries if "projections_subscription" in q["sql"]
                 and "COUNT(" in q["sql"].upper())
    depth = getattr(SubscriptionAdmin, "shard_list_depth", None)
    SubscriptionAdmin.shard_list_depth = 200
    try:
        deep = client.get("/admin/projections/subscription/", {"q": run, "p": 3})
    finally:
        SubscriptionAdmin.shard_list_depth = depth
    deep_html = deep.content.decode()
    # Only shard1 has subscriptions (default's are removed inside a transaction rolled back afterwards).
    with transaction.atomic(using=default):
        Subscription.objects.using(default).all().delete()
        only = client.get("/admin/projections/subscription/", {"q": f"{run}-a"}).content.decode()
        transaction.set_rollback(True, using=default)
    # One id on both shards: shard1's change page, then its History link.
    shared = Subscription.objects.using(other).filter(consumer=f"{run}-a-000").get().pk
    Subscription.objects.using(default).update_or_create(
        id=shared, defaults={"consumer": f"{run}-h-default", "stream": "s"})
    Subscription.objects.using(other).filter(pk=shared).update(consumer=f"{run}-h-shard1")
    change = client.get(f"/admin/projections/subscription/{shared}/change/", {"shard": other}).content.decode()
    history_link = re.search(r'href="([^"]*/history/[^"]*)"', change)
    history = client.get(history_link[1].replace("&amp;", "&")).content.decode() if history_link else ""
    title = re.search(r"<title>(.*?)</title>", history, re.S)
    return {"collations": collations, "pages": pages, "listed": listed, "count": counted and counted[1],
            "default_counts": counts, "deep": [deep.status_code, len(_consumers(deep_html, run)),
                                               "past the first 200 rows" in deep_html],
            "only_rows": len(_consumers(only, run)), "only_actions": 'name="action"' in only,
            "history_link": history_link and history_link[1], "history_title": title and title[1].strip(),
            "change_shows": f"{run}-h-shard1" in change}


def admin_shard_down(arg) -> dict:
    """A third shard whose server does not answer (nothing listens on its port): every list page still lists
    the reachable shards' rows, with an error naming the unreachable one; a row's page on it answers 503."""
    import re

    from journal import shards
    from projections.models import Subscription

    run = arg["run"]
    up, down = shards.shards()[:2], shards.shards()[2]
    for alias in up:
        Subscription.objects.using(alias).create(consumer=f"{run}-d-on-{alias}", stream="s")
    client = _admin_client(run)
    lists = {}
    for url in ("/admin/journal/execution/", "/admin/projections/subscription/", "/admin/leases/worker/",
                "/admin/queues/queue/", "/admin/journal/event/", "/admin/projections/checkpoint/"):
        response = client.get(url, {"q": run} if "subscription" in url else {})
        errors = re.findall(r'<li class="error">(.*?)</li>', response.content.decode())
        lists[url] = [response.status_code, response.get("Location"),
                      any(f"“{down}” could not be read" in m for m in errors)]
    subs = client.get("/admin/projections/subscription/", {"q": run}).content.decode()
    on_down = next(f"{run}-x{i}" for i in range(1000) if shards.shard_for(f"{run}-x{i}") == down)
    pages = {}
    for url in (f"/admin/projections/subscription/1/change/?shard={down}",
                f"/admin/journal/execution/{on_down}/change/", f"/admin/journal/execution/{on_down}/cancel/"):
        response = client.get(url)
        pages[url] = [response.status_code, f"“{down}” could not be read" in response.content.decode()]
    return {"lists": lists, "pages": pages, "down": down,
            "listed": sorted(set(re.findall(rf">({re.escape(run)}-d-on-[a-z0-9]+)<", subs)))}


def forget_shard_down(arg) -> dict:
    """A subject's data on three shards, its keys cached; then the third shard's server stops answering (its
    alias re-pointed at a port where nothing listens, in this process): forget, the admin's forget action, then
    the shard back (the alias re-pointed at its server) and forget again."""
    import io
    import re

    from django.core.management import call_command
    from django.db import connections

    from journal import shards
    from journal.envelopes import Envelope
    from journal.models import DataKey, Event
    from journal.privacy import FORGOTTEN, forget, keys
    from journal.privacy.forget import AUDIT_STREAM, FORGOTTEN_EVENT
    from tests import privacy_fixtures  # noqa: F401  (PrivacyOrder)

    run = arg["run"]
    down = shards.shards()[2]
    real_port = connections[down].settings_dict["PORT"]
    ann, cid, dan, eve = (f"{run}-{who}" for who in ("ann", "cid", "dan", "eve"))  # forget, admin, admin, CLI
    streams = ids_on_each_shard(f"{run}-o", 1)
    for sid in streams:
        for who in (ann, cid, dan, eve):
            Event.objects.append(sid, Envelope("PrivacyOrder", {"customer_id": who, "email": f"{who}@example.org"}))

    def point(alias: str, port) -> None:
        connections[alias].close()
        connections[alias].settings_dict["PORT"] = port

    def reads(who: str) -> dict:
        out = {}
        for sid in streams:
            try:
                out[shards.shard_for(sid)] = [e.payload["email"] for e in Event.objects.read(sid)
                                              if e.payload["customer_id"] == who]
            except Exception as exc:
                out[shards.shard_for(sid)] = type(exc).__name__
        return out

    def tombstoned(who: str, aliases: list[str]) -> dict:
        return {a: DataKey.objects.using(a).filter(subject=who, wrapped__isnull=True).exists() for a in aliases}

    def audits(who: str, aliases: list[str]) -> dict:
        return {a: sum(1 for e in Event.objects.db_manager(a).read(AUDIT_STREAM)
                       if e.type == FORGOTTEN_EVENT and e.payload.get("subject") == who) for a in aliases}

    def attempt(who: str) -> dict:
        try:
            forget(who, by="dpo")
        except Exception as exc:
            return {"error": type(exc).__name__, "text": str(exc), "notes": getattr(exc, "__notes__", []),
                    "forgotten": getattr(exc, "forgotten", None), "failed": sorted(getattr(exc, "failed", {}) or [])}
        return {"error": None}

    before = reads(ann)
    cached_before = keys.cache.get(down, ann) is not None and keys.cache.get(down, ann)[1] is not None
    up = [a for a in shards.shards() if a != down]
    point(down, "5439")
    failed = attempt(ann)
    facts = {"down": down, "up": up, "before": before, "cached_before": cached_before, "failed": failed,
             "cached_after": keys.cache.get(down, ann), "reads_down": reads(ann),
             "tombstones_down": tombstoned(ann, up), "audits_down": audits(ann, up)}
    # The admin's action, the subject ticked on the reachable shards (the list shows no row of the down one).
    # Two subjects ticked: the first's failure on the down shard must not keep the second from being forgotten.
    client = _admin_client(run)

    def action(query: str, data: dict) -> dict:
        response = client.post("/admin/journal/datakey/?q=" + query, {"action": "forget_subjects", "index": 0,
                                                                      "post": "yes", **data}, follow=True)
        html = response.content.decode()
        return {"status": response.status_code, "errors": re.findall(r'<li class="error">(.*?)</li>', html, re.S),
                "successes": re.findall(r'<li class="success">(.*?)</li>', html, re.S)}

    facts["admin"] = {**action(run, {"_selected_action": [f"{a}:{who}" for a in up for who in (cid, dan)]}),
                      "tombstones": {who: tombstoned(who, up) for who in (cid, dan)}}
    # Every row matching the search (select_across): the down shard's rows cannot be read, so nothing is done.
    facts["admin_across"] = {**action(eve, {"select_across": "1", "_selected_action": [f"{up[0]}:{eve}"]}),
                             "tombstones": tombstoned(eve, up)}
    try:
        call_command("loom_keys", "forget", eve, "--by", "dpo", stdout=io.StringIO())
        facts["cli"] = None
    except Exception as exc:
        facts["cli"] = [type(exc).__name__, str(exc)]
    facts["cli_tombstones"] = tombstoned(eve, up)
    point(down, real_port)
    facts["back"] = {"reads_before_again": reads(ann), "audits": audits(ann, [down]),
                     "again": [attempt(ann), attempt(ann), attempt(cid), attempt(dan), attempt(eve)],
                     "reads": {who: reads(who) for who in (ann, cid, dan, eve)},
                     "tombstones": {who: tombstoned(who, shards.shards()) for who in (ann, cid, dan, eve)},
                     "audits_after": audits(ann, shards.shards())}
    facts["forgotten"] = FORGOTTEN
    return facts


def telemetry_per_shard(arg) -> dict:
    """Executions on both shards; the metrics page's executions gauge per alias (journal/telemetry.py, read
    from each shard at scrape time) beside each shard's own rows."""
    from prometheus_client.parser import text_string_to_metric_families

    from journal import shards, telemetry
    from journal.flows import start
    from journal.models import Execution

    for eid in ids_on_each_shard("telm", 2):
        assert start("shards.one", {}, eid).status == "completed"
    page = telemetry.exposition()[0].decode()
    seen = {s.labels["alias"]: s.value for f in text_string_to_metric_families(page) for s in f.samples
            if s.name == "loom_executions" and s.labels["flow"] == "shards.one" and s.labels["status"] == "completed"}
    db = {alias: Execution.objects.using(alias).filter(flow="shards.one", status="completed").count()
          for alias in shards.shards()}
    return {"seen": seen, "db": db}


def retention_kin(arg) -> dict:
    """Retention x shards: a settled parent whose child (started with its own id) lives on the other shard is
    kept while the child is live, and the child while the parent is; both go once both are settled."""
    from datetime import timedelta

    from django.contrib.auth import get_user_model
    from django.test import Client, override_settings
    from django.utils import timezone

    from journal import retention, shards
    from journal.flows import start
    from journal.models import Execution

    first, second = shards.shards()[:2]
    parent = next(e for e in ids_on_each_shard(f"{arg['run']}-p", 1) if shards.shard_for(e) == first)
    child = next(e for e in ids_on_each_shard(f"{arg['run']}-c", 1) if shards.shard_for(e) == second)
    start("shards.parent", {"n": 1, "child": child}, execution_id=parent)
    old = timezone.now() - timedelta(days=40)

    def mark(alias: str, eid: str, status: str) -> None:
        Execution.objects.using(alias).filter(pk=eid).update(
            status=status, finished_at=old if status in ("completed", "failed", "cancelled") else None)

    out = {"child_shard": shards.shard_for(child), "parent_shard": shards.shard_for(parent)}
    with override_settings(LOOM_RETENTION_DAYS=30):
        mark(first, parent, "completed")
        mark(second, child, "running")
        out["parent_while_child_live"] = retention.run(first)["executions"]
        mark(first, parent, "waiting")
        mark(second, child, "completed")
        out["child_while_parent_live"] = retention.run(second)["executions"]
        mark(first, parent, "completed")
        user, _ = get_user_model().objects.get_or_create(username=f"{arg['run']}-admin", is_staff=True,
                                                         is_superuser=True)
        client = Client()
        client.force_login(user)
        page = client.get("/admin/journal/removal/").content.decode()
        found = re.search(r"default: 30 day\(s\), (\d+) execution\(s\) due", page, re.I)
        out["admin_due"] = found.group(1) if found else page
        mark(first, parent, "completed")
        out["both_settled"] = [retention.run(first)["executions"], retention.run(second)["executions"]]
    out["left"] = [Execution.objects.using(a).filter(pk=e).exists() for a, e in ((first, parent), (second, child))]
    return out


def operations_figures(arg) -> dict:
    """The operations page's figures read every shard: depth, oldest pending, throughput, troubled executions."""
    from journal import shards
    from journal.flows import start
    from journal.models import Execution
    from queues import declare_queue, enqueue, operations

    run = arg["run"]
    queue = f"{run}-q"
    declare_queue(queue, concurrency=5)
    pending = ids_on_each_shard(f"{run}-e", 1)
    for eid in pending:
        enqueue("shards.one", 1, queue=queue, execution_id=eid)
    done = ids_on_each_shard(f"{run}-d", 1)
    for eid in done:
        start("shards.one", 1, execution_id=eid)
    stuck = ids_on_each_shard(f"{run}-s", 1)
    for eid in stuck:
        start("shards.one", 1, execution_id=eid)
        Execution.objects.using(shards.shard_for(eid)).filter(pk=eid).update(status="stuck")
    edges = operations.bucket_edges("hour")
    depth = {s.name: s.points[-1][1] for s in operations.depth_series("hour", edges=edges)}
    completed = operations.throughput_series("hour", edges=edges)[0][0]
    width = operations.WINDOWS["hour"][0] / operations.WINDOWS["hour"][1]
    in_db = sum(Execution.objects.using(alias).filter(status="completed", finished_at__gt=edges[0] - width,
                                                      finished_at__lte=edges[-1]).count() for alias in shards.shards())
    oldest = {q.name: q.oldest_pending for q in operations.queues()}
    return {"pending_shards": sorted(shards.shard_for(e) for e in pending), "depth": depth.get(queue),
            "completed_now": sum(v for _, v in completed.points), "completed_in_db": in_db,
            "completed_shards": sorted(shards.shard_for(e) for e in done), "oldest_seen": oldest.get(queue) is not None,
            "troubled": sorted(eid for eid, *_ in operations.troubled() if eid in stuck), "stuck": sorted(stuck)}


def operations_shard_down(arg) -> dict:
    """A third shard whose server does not answer: the operations page, the executions list searched by an
    input value, and the API's `GET /api/executions` (every token kind) answer without a traceback: the pages
    show the reachable shards and name the down one; the API answers 503 naming it (a partial page would
    move its cursor past the down shard's rows for good)."""
    import io
    import re

    from django.core.management import CommandError, call_command
    from django.test import override_settings

    from journal import shards
    from journal.flows import start
    from leases.models import Worker
    from queues import declare_queue, enqueue

    run = arg["run"]
    up, down = shards.shards()[:2], shards.shards()[2]
    declare_queue(f"{run}-q", concurrency=2)
    marked = [e for e in ids_on_each_shard(f"{run}-m", 1) if shards.shard_for(e) in up]
    for eid in marked:
        start("shards.one", {"mark": f"{run}-needle"}, execution_id=eid)
    queued = next(f"{run}-p{i}" for i in range(1000) if shards.shard_for(f"{run}-p{i}") == up[1])
    enqueue("shards.one", 1, queue=f"{run}-q", execution_id=queued)
    Worker.objects.using(up[0]).update_or_create(id=f"{run}-w", defaults={"host": "h", "pid": 1, "role": "main",
                                                                          "stopped_at": None})
    client = _admin_client(run)
    pages = {}
    for url, params in (("/admin/queues/queue/operations/", {}), ("/admin/queues/queue/operations/", {"window": "day"}),
                        ("/admin/journal/execution/", {"q": f"{run}-needle"}),
                        ("/admin/journal/execution/", {"q": queued})):
        response = client.get(url, params)
        html = response.content.decode()
        pages[f"{url}?{params}"] = [response.status_code, f"“{down}” could not be read" in html,
                                    sorted(set(re.findall(rf">({re.escape(run)}-(?:m-\d+|p\d+|q))<", html)))]
    from django.contrib import admin
    from django.urls import NoReverseMatch, reverse

    every = {}  # every list page of the admin, and its own pages: never a 500
    for model in admin.site._registry:
        try:
            url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
        except NoReverseMatch:
            continue
        every[url] = client.get(url).status_code
    for name in ("admin:journal_execution_flow_versions", "admin:queues_operations"):
        try:
            every[reverse(name)] = client.get(reverse(name)).status_code
        except NoReverseMatch:
            every[name] = "no such page"
    versions = client.get(reverse("admin:journal_execution_flow_versions")).content.decode()
    retire = {"named": f"“{down}” could not be read" in versions, "safe": "safe: none live" in versions,
              "unknown": f"unknown: {down} not read" in versions, "flow": ">shards.one<" in versions}
    tokens = [{"token": "t-full-" + "x" * 30, "name": "full"}, {"token": "t-own-" + "y" * 30, "name": "own",
                                                                 "read": "own"}]
    api = {}
    with override_settings(LOOM_API_AUTH=True, LOOM_API_TOKENS=tokens):
        for token in tokens:
            response = client.get("/api/executions", headers={"Authorization": f"Bearer {token['token']}"})
            body = response.json()
            api[token["name"]] = [response.status_code, body.get("error", {}).get("code"),
                                  down in body.get("error", {}).get("message", "")]
    # The metrics page with the down shard in the middle of LOOM_SHARDS: the shard after it still reported.
    with override_settings(LOOM_API_AUTH=True, LOOM_API_TOKENS=tokens, LOOM_METRICS=True,
                           LOOM_SHARDS=[up[0], down, up[1]]):
        response = client.get("/api/metrics", headers={"Authorization": f"Bearer {tokens[0]['token']}"})
    text = response.content.decode()
    metrics = {"status": response.status_code,
               "ok": sorted(re.findall(r'loom_scrape_database_ok\{alias="(\w+)"\} (\S+)', text)),
               "depth": re.findall(rf'loom_queue_depth\{{alias="(\w+)",queue="{re.escape(run)}-q"\}} (\S+)', text),
               "executions": sorted(set(re.findall(r'loom_executions\{alias="(\w+)"', text)))}
    acted = {}  # the page's actions with a shard down: a message naming the failure, never a 500 (after the
    # metrics read: a pause first writes the declared queue's row on every shard it reaches)
    for action in ("pause_queue", "resume_queue"):
        response = client.post("/admin/queues/queue/operations/", {"action": action, "name": f"{run}-q"}, follow=True)
        acted[action] = [response.status_code, "a database could not be reached" in response.content.decode()]
    cli = {}
    for args in (["executions", "list", "--search", f"{run}-needle"], ["workers"], ["queues"], ["flows"]):
        out = io.StringIO()
        try:
            call_command("loom", *args, "--json", stdout=out, stderr=io.StringIO())
            cli[args[0]] = [0, out.getvalue()[:300]]
        except CommandError as exc:
            cli[args[0]] = [exc.returncode, json.loads(out.getvalue() or "{}")]
        except Exception as exc:  # a traceback for the operator
            cli[args[0]] = [type(exc).__name__, str(exc)[:200]]
    return {"acted": acted, "down": down, "pages": pages, "api": api, "marked": sorted(marked), "queued": queued,
            "metrics": metrics, "cli": cli, "every": every, "retire": retire}


def main() -> None:
    django.setup()
    name = sys.argv[1]
    arg = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    result = globals()[name](arg)
    print(json.dumps(result, default=str), flush=True)


if __name__ == "__main__":
    main()
