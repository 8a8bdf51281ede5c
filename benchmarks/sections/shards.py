"""Section `shards`: the same work on 1 shard and on 2 shards (two PostgreSQL servers), and through PgBouncer.

Cells, interleaved repeat by repeat so that both sides of a ratio see the same machine:
- `coalesced appends`: writer threads each appending one event to a new stream per call through the
  process's coalescers (LOOM_COALESCE: one coalescer, and so one statement per batch, per shard);
- `1-step flows`: threads starting durable one-step executions back to back (direct writes), with every
  statement counted per shard: the statements per execution on its shard must not change with sharding;
- `pooled`: the 1-step flows through PgBouncer in transaction pooling (no named prepared statements,
  journal/store/postgres.py may_prepare) beside the same flows on a direct connection.
Each pair gets a `ratio` cell (2 shards / 1 shard; pooled / direct) from the medians of its repeats.

Two servers on one 2-core machine do not double throughput: both servers, the Python process and its threads
share the same two cores (and one disk for the WAL flushes), so a second server adds parallel commit paths
(two WAL flushes in flight) but no CPU. The ratio measures what sharding costs or gains on the same hardware;
on separate hosts each shard brings its own cores and disk.

The second server (`--shard-server`, default 127.0.0.1:5433) and the pooler (`--pooler`, 127.0.0.1:6432,
in front of the main database's server) are the ones scripts/shard-servers starts; when absent the section
(or its pooled cells) is skipped with one line. The shard database is `<main database>_bench_s1` on the second
server, created and migrated on first use. docs/scaling.md has the figures.
"""

from __future__ import annotations

import copy
import socket
import statistics
import threading

from django.conf import settings
from django.core.management import call_command
from django.db import connections
from django.db.backends.signals import connection_created
from django.test import override_settings

from benchmarks import streams
from benchmarks.arguments import positive_int
from benchmarks.harness import StatementCounter, run_workers
from benchmarks.sections import durable  # noqa: F401  (registers the bench.noop1 flow)
from journal import coalesce, shards
from journal.envelopes import AppendItem, Envelope
from journal.flows import start
from journal.store import store_for
from leases.keeper import drop_keeper

SHARD_ALIAS = "bench_shard1"
POOLED_ALIAS = "bench_pooled"
ROUTERS = ["journal.shards.ShardRouter"]


def add_arguments(parser) -> None:
    parser.add_argument("--shard-server", default="127.0.0.1:5433",
                        help="host:port of the second PostgreSQL server (default 127.0.0.1:5433).")
    parser.add_argument("--pooler", default="127.0.0.1:6432",
                        help="host:port of PgBouncer in transaction pooling before the main server (default :6432).")
    parser.add_argument("--shard-writers", type=positive_int, default=8, help="Appending threads (default 8).")
    parser.add_argument("--shard-appends", type=positive_int, default=300,
                        help="Appends per writer per cell (default 300).")
    parser.add_argument("--shard-flow-threads", type=positive_int, default=8,
                        help="Threads starting flows (default 8).")
    parser.add_argument("--shard-flows", type=positive_int, default=1200,
                        help="One-step executions per cell, over its threads (default 1200).")
    parser.add_argument("--shard-repeats", type=positive_int, default=3, help="Interleaved repeats (default 3).")


def _reachable(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


def _add_alias(alias: str, base: str, address: str, name: str, pooled: bool = False) -> None:
    """A database alias beside `base` (same user and options) at `address`, known to Django from now on."""
    cfg = copy.deepcopy(connections[base].settings_dict)
    direct_host, direct_port = cfg.get("HOST"), cfg.get("PORT")
    cfg["HOST"], cfg["PORT"] = address.rsplit(":", 1)
    cfg["NAME"] = name
    cfg["TEST"] = {**cfg.get("TEST", {}), "NAME": name}
    if pooled:
        cfg["DISABLE_SERVER_SIDE_CURSORS"] = True
        cfg["LOOM_DIRECT"] = {"HOST": direct_host, "PORT": direct_port}
    settings.DATABASES[alias] = cfg
    connections.settings[alias] = cfg


def _ensure_database(address: str, name: str, base: str) -> None:
    import psycopg

    host, port = address.rsplit(":", 1)
    user = connections[base].settings_dict.get("USER") or None
    with psycopg.connect(host=host, port=int(port), dbname="postgres", user=user, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is None:
            conn.execute(f'CREATE DATABASE "{name}"')


class PerAlias:
    """Statements of every connection opened inside the block, counted per database alias."""

    def __init__(self) -> None:
        self.counters: dict[str, StatementCounter] = {}
        self.lock = threading.Lock()
        self.uid = f"bench-shards-{id(self)}"

    def __enter__(self) -> PerAlias:
        def install(sender, connection, **kwargs) -> None:
            with self.lock:
                counter = self.counters.setdefault(connection.alias, StatementCounter())
            counter.install(connection)

        connection_created.connect(install, weak=False, dispatch_uid=self.uid)
        return self

    def __exit__(self, *exc) -> None:
        connection_created.disconnect(dispatch_uid=self.uid)

    def snapshot(self) -> dict[str, int]:
        return {alias: counter.snapshot()[0] for alias, counter in self.counters.items()}


def prepare(base: str, shard_server: str, pooler: str) -> tuple[str | None, str | None]:
    """Make the section's aliases known (idempotent; the pooled one even when the pooler does not answer, so
    a test can declare both): the second server's database, created on first use. Returns the aliases whose
    server answers (None for the others)."""
    shard = None
    if _reachable(shard_server):
        name = f"{connections[base].settings_dict['NAME']}_bench_s1"
        if SHARD_ALIAS not in connections.settings:
            _ensure_database(shard_server, name, base)
            _add_alias(SHARD_ALIAS, base, shard_server, name)
        shard = SHARD_ALIAS
    if POOLED_ALIAS not in connections.settings:
        _add_alias(POOLED_ALIAS, base, pooler, connections[base].settings_dict["NAME"], pooled=True)
    return shard, POOLED_ALIAS if _reachable(pooler) else None


def forget() -> None:
    """Drop the section's aliases again (tests: later tests must not see them), and have the pooler close its
    server connections to the pooled database, which would otherwise keep it from being dropped."""
    if POOLED_ALIAS in connections.settings:
        release_pooled(connections[POOLED_ALIAS].settings_dict)
    for alias in (SHARD_ALIAS, POOLED_ALIAS):
        if alias in connections.settings:
            connections[alias].close()
            del connections.settings[alias]
            settings.DATABASES.pop(alias, None)


def release_pooled(cfg: dict) -> None:
    """KILL and RESUME the database on PgBouncer's admin console (admin_users, scripts/shard-servers): its
    server connections close now rather than after server_idle_timeout. The console speaks the simple query
    protocol only, hence the client-side cursor."""
    import psycopg

    if not _reachable(f"{cfg['HOST']}:{cfg['PORT']}"):
        return
    try:
        with psycopg.connect(host=cfg["HOST"], port=int(cfg["PORT"]), dbname="pgbouncer", user=cfg.get("USER") or None,
                             autocommit=True, cursor_factory=psycopg.ClientCursor) as conn:
            conn.execute(f"KILL {cfg['NAME']}")
            conn.execute(f"RESUME {cfg['NAME']}")
    except psycopg.Error:
        pass  # not an admin of this pooler: its connections close after server_idle_timeout


def run(ctx) -> None:
    if ctx.vendor != "postgresql":
        return ctx.skip("PostgreSQL only (shards are PostgreSQL servers)")
    base = shards.shards()[0]
    shard, pooled = prepare(base, ctx.options["shard_server"], ctx.options["pooler"])
    if shard is None:
        return ctx.skip(f"no second PostgreSQL server on {ctx.options['shard_server']} (scripts/shard-servers)")
    # Every app's tables (a test flushes the alias, and Django's flush expects them); up to date after the first run.
    call_command("migrate", database=SHARD_ALIAS, interactive=False, verbosity=0)
    if pooled is None:
        ctx.log(f"shards: no PgBouncer on {ctx.options['pooler']}: pooled cells skipped")
    layouts = {"1 shard": [base], "2 shards": [base, SHARD_ALIAS]}
    figures: dict[tuple[str, str], list[float]] = {}
    for repeat in range(ctx.options["shard_repeats"]):
        for layout, aliases in layouts.items():
            figures.setdefault(("coalesced appends", layout), []).append(_appends(ctx, layout, aliases, repeat))
            figures.setdefault(("1-step flows", layout), []).append(_flows(ctx, "1-step flows", layout, aliases,
                                                                          repeat))
        if pooled:
            for layout, aliases in (("direct", [base]), ("pgbouncer", [POOLED_ALIAS])):
                figures.setdefault(("pooled", layout), []).append(_flows(ctx, "pooled", layout, aliases, repeat))
    for scenario, (top, bottom) in (("coalesced appends", ("2 shards", "1 shard")),
                                    ("1-step flows", ("2 shards", "1 shard")), ("pooled", ("pgbouncer", "direct"))):
        if (scenario, top) in figures:
            a, b = statistics.median(figures[(scenario, top)]), statistics.median(figures[(scenario, bottom)])
            ctx.record(f"{scenario} ratio", {"of": f"{top} / {bottom}", "repeats": ctx.options["shard_repeats"]},
                       ratio=round(a / b, 3) if b else None, median_top=round(a, 1), median_bottom=round(b, 1))


def _appends(ctx, layout: str, aliases: list[str], repeat: int) -> float:
    writers, per = ctx.options["shard_writers"], ctx.options["shard_appends"]
    pfx = streams.prefix(ctx.run_id, "shards-app", len(aliases), repeat)

    def op(w: int, i: int) -> int:
        coalesce.append_item(AppendItem.build(f"{pfx}{w}:{i}", [Envelope("Bench", {"i": i})]))
        return 1

    coalesce.close_shared()
    with override_settings(LOOM_SHARDS=aliases, DATABASE_ROUTERS=ROUTERS, LOOM_COALESCE=True), PerAlias() as count:
        try:
            outcome = run_workers(writers, per, op)
        finally:
            statements = {a: c.statements for a in aliases if (c := coalesce.running(a)) is not None}
            coalesce.close_shared()
        if outcome.errors:
            raise RuntimeError(f"shards appends {layout}: {outcome.errors[:3]}")
        rows = {a: store_for(a).count_events(pfx) for a in aliases}
        ctx.verify(f"appends {layout} events", outcome.units, sum(rows.values()))
        misplaced = sum(1 for w in range(writers) for i in range(0, per, 37)
                        if store_for(shards.shard_for(f"{pfx}{w}:{i}")).tip(f"{pfx}{w}:{i}") != 0)
        ctx.verify(f"appends {layout} streams off their shard", 0, misplaced)
        if not ctx.options.get("keep"):
            for a in aliases:
                store_for(a).delete_streams(pfx)
    ctx.record("coalesced appends", {"layout": layout, "shards": len(aliases), "writers": writers, "repeat": repeat},
               throughput=outcome.throughput, unit="events/s", latencies_ms=outcome.latencies_ms, count=outcome.units,
               events_per_shard=rows, statements_per_shard=statements,
               events_per_statement=round(outcome.units / max(1, sum(statements.values())), 2),
               all_statements_per_shard=count.snapshot())
    return outcome.throughput


def _flows(ctx, scenario: str, layout: str, aliases: list[str], repeat: int) -> float:
    threads = ctx.options["shard_flow_threads"]
    per = max(1, ctx.options["shard_flows"] // threads)
    pfx = streams.prefix(ctx.run_id, "shards-flow", layout.replace(" ", ""), repeat)

    def op(w: int, i: int) -> int:
        out = start("bench.noop1", {}, execution_id=f"{pfx}{w}:{i}")
        if out.status != "completed":
            raise RuntimeError(f"{out.execution_id}: {out.status} {out.error}")
        return 1

    coalesce.close_shared()
    with override_settings(LOOM_SHARDS=aliases, DATABASE_ROUTERS=ROUTERS, LOOM_COALESCE=False), \
            PerAlias() as count:
        outcome = run_workers(threads, per, op)
        if outcome.errors:
            raise RuntimeError(f"shards {scenario} {layout}: {outcome.errors[:3]}")
        statements = count.snapshot()
        executions = {a: store_for(a).count_executions(pfx, "completed") for a in aliases}
        ctx.verify(f"{scenario} {layout} executions completed", outcome.units, sum(executions.values()))
        ctx.verify(f"{scenario} {layout} events beyond 4 per execution", 0,
                   sum(store_for(a).count_events(pfx) for a in aliases) - 4 * outcome.units)
        if not ctx.options.get("keep"):
            for a in aliases:
                store_for(a).delete_streams(pfx)
                store_for(a).delete_executions(pfx)
    for alias in aliases:  # the keepers of the section's own aliases end with the cell (lazy leases may start them)
        if alias in (SHARD_ALIAS, POOLED_ALIAS):
            drop_keeper(alias)
    per_shard = {a: round(statements.get(a, 0) / executions[a], 3) for a in aliases if executions[a]}
    ctx.record(scenario, {"layout": layout, "shards": len(aliases), "threads": threads, "repeat": repeat},
               throughput=outcome.throughput, unit="exec/s", latencies_ms=outcome.latencies_ms, count=outcome.units,
               executions_per_shard=executions, statements_per_execution_per_shard=per_shard)
    return outcome.throughput
