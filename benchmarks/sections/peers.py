"""Section `peers` (PostgreSQL, optional extra `peers`): what a Python user would pick instead, in the same run.

Two pairs, each side doing the same shape of work on the same PostgreSQL server, at 1, 8 and 32
concurrent callers (`--peer-concurrency`), each caller on its own aggregate or execution:

- **eventsourcing** (the `eventsourcing` library, its PostgreSQL recorder, default settings): per
  command, `repository.get` the caller's aggregate, call one method that triggers one event, `save`.
  Ours: `journal.aggregates.do(increment, id, {"by": 1})` on the bench counter (load, decide, one
  guarded append).
- **DBOS** (DBOS Transact, `@DBOS.workflow` with one `@DBOS.step`, called directly): one durable
  one-step workflow per call, its system database next to ours on the same server. Ours: `start()`
  of the durable one-step no-op flow (`bench.noop1`) with a caller-chosen id.

The two sides of a pair run back to back for `--peer-repeats` rounds in a rotating order; each
side's cell records the median throughput, the pooled latencies (p50/p99), the throughput of each
repeat (`runs`) and the ratio ours / theirs (`vs_eventsourcing`, `vs_dbos`: above 1 we are faster).
Both run fully offline. Without the packages (`pip install -e .[peers]`) or on SQLite the section
says so in one line and skips. Every round is verified: the events each side's aggregates hold, and
the completed executions or workflows.
"""

from __future__ import annotations

import contextlib
import importlib.util
import secrets
import statistics
import threading

from django.db import connection

from benchmarks import streams
from benchmarks.arguments import positive_int, positive_int_list
from benchmarks.cells import raise_errors
from benchmarks.harness import run_workers
from benchmarks.sections import durable  # noqa: F401  (registers bench.noop1)
from benchmarks.sections.aggregates import counter, increment
from benchmarks.sections.durable import count_headers, remove_headers
from journal.aggregates import do, load
from journal.flows import start

DEFAULT_CONCURRENCY = "1,8,32"


def add_arguments(parser) -> None:
    parser.add_argument("--peer-concurrency", type=positive_int_list, default=DEFAULT_CONCURRENCY,
                        help=f"Concurrent callers of the peers section (default {DEFAULT_CONCURRENCY}).")
    parser.add_argument("--peer-ops", type=positive_int, default=50,
                        help="Commands or executions per caller per round (default 50).")
    parser.add_argument("--peer-repeats", type=positive_int, default=3,
                        help="Interleaved rounds of each pair; medians are recorded (default 3).")


def missing_packages() -> list[str]:
    return [name for name in ("eventsourcing", "dbos") if importlib.util.find_spec(name) is None]


def run(ctx) -> None:
    if ctx.vendor != "postgresql":
        ctx.skip("the peers run on PostgreSQL only (eventsourcing's and DBOS's PostgreSQL backends)")
        return
    missing = missing_packages()
    if missing:
        ctx.skip(f"{' and '.join(missing)} not installed (pip install -e .[peers])")
        return
    opts = ctx.options
    concs, ops, repeats = list(opts["peer_concurrency"]), opts["peer_ops"], opts["peer_repeats"]
    with _EventSourcingSide(ctx) as es:
        _pair(ctx, "eventsourcing", ("ours: aggregate do()", _OurAggregates(ctx)), ("eventsourcing", es),
              concs, ops, repeats)
    with _DbosSide(ctx) as dbos:
        _pair(ctx, "dbos", ("ours: durable one-step flow", _OurFlows(ctx)), ("DBOS one-step workflow", dbos),
              concs, ops, repeats)


def _pair(ctx, peer: str, ours: tuple, theirs: tuple, concs: list[int], ops: int, repeats: int) -> None:
    for conc in concs:
        sides = (ours, theirs)
        samples: dict[str, list] = {name: [] for name, _ in sides}
        for rep in range(repeats):
            for name, side in sides[rep % 2:] + sides[:rep % 2]:
                samples[name].append(side.round(conc, ops, rep))
        medians = {name: statistics.median(o.throughput for o in runs) for name, runs in samples.items()}
        ratio = medians[ours[0]] / medians[theirs[0]] if medians[theirs[0]] else None
        for name, runs in samples.items():
            unit = "commands/s" if peer == "eventsourcing" else "exec/s"
            ctx.record(name, {"peer": peer, "concurrency": conc, "ops": ops, "repeats": repeats},
                       throughput=medians[name], unit=unit, latencies_ms=[ms for o in runs for ms in o.latencies_ms],
                       count=sum(o.units for o in runs), runs=[round(o.throughput, 1) for o in runs],
                       **{f"vs_{peer}": round(ratio, 3) if ratio else None})


# -- the peers' own definitions, made once per process ------------------------------------------------
# Both libraries register classes and functions globally by name (eventsourcing's topics, DBOS's
# registry), so they are defined on first use and reused by every later run in the same process.

_defined: dict = {}
_dbos_steps = {"count": 0}
_dbos_lock = threading.Lock()


def _es_counter():
    if "es_counter" not in _defined:
        from eventsourcing.domain import Aggregate, event

        class EsCounter(Aggregate):
            @event("Created")
            def __init__(self) -> None:
                self.count = 0

            @event("Incremented")
            def increment(self, by: int) -> None:
                self.count += by

        _defined["es_counter"] = EsCounter
    return _defined["es_counter"]


def _dbos_workflow():
    if "dbos_workflow" not in _defined:
        from dbos import DBOS

        @DBOS.step()
        def bench_noop_step() -> int:
            with _dbos_lock:
                _dbos_steps["count"] += 1
            return 1

        @DBOS.workflow()
        def bench_one_step(value: dict) -> int:
            return bench_noop_step()

        _defined["dbos_workflow"] = bench_one_step
    return _defined["dbos_workflow"]


# -- eventsourcing ------------------------------------------------------------------------------------


class _EventSourcingSide:
    """The eventsourcing library's Application over its PostgreSQL recorder, on our database."""

    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self.schema = f"bench_es_{ctx.run_id}"

    def __enter__(self):
        from eventsourcing.application import Application

        self.counter_cls = _es_counter()
        s = connection.settings_dict
        with connection.cursor() as cursor:  # the library's tables in a schema of their own, dropped after
            cursor.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
        self.app = Application(env={
            "PERSISTENCE_MODULE": "eventsourcing.postgres", "POSTGRES_DBNAME": s["NAME"],
            "POSTGRES_HOST": s["HOST"] or "127.0.0.1", "POSTGRES_PORT": str(s["PORT"] or 5432),
            "POSTGRES_USER": s["USER"] or "postgres", "POSTGRES_PASSWORD": s["PASSWORD"] or "",
            "POSTGRES_SCHEMA": self.schema, "POSTGRES_POOL_SIZE": "40", "POSTGRES_MAX_OVERFLOW": "0",
            "CREATE_TABLE": "y",
        })
        return self

    def __exit__(self, *exc) -> None:
        with contextlib.suppress(Exception):
            self.app.close()
        if not self.ctx.options.get("keep"):
            with connection.cursor() as cursor:
                cursor.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')

    def round(self, conc: int, ops: int, rep: int):
        ids = []
        for _ in range(conc):
            agg = self.counter_cls()
            self.app.save(agg)
            ids.append(agg.id)

        def op(w: int, i: int) -> int:
            agg = self.app.repository.get(ids[w])
            agg.increment(1)
            self.app.save(agg)
            return 1

        bar = self.ctx.progress(conc * ops, f"eventsourcing c={conc} #{rep + 1}")
        outcome = run_workers(conc, ops, op, progress=bar.update)
        bar.close()
        raise_errors(f"peers eventsourcing c={conc}", outcome.errors)
        counted = sum(self.app.repository.get(agg_id).count for agg_id in ids)
        self.ctx.verify(f"eventsourcing c={conc} round {rep + 1} increments folded", outcome.units, counted)
        return outcome


class _OurAggregates:
    def __init__(self, ctx) -> None:
        self.ctx = ctx

    def round(self, conc: int, ops: int, rep: int):
        pfx = streams.prefix(self.ctx.run_id, "peers", "agg", conc, rep)
        base = pfx[len("bench:"):]  # the bench counter's prefix "bench:" completes the stream id

        def op(w: int, i: int) -> int:
            do(increment, f"{base}{w}", {"by": 1})
            return 1

        bar = self.ctx.progress(conc * ops, f"ours aggregates c={conc} #{rep + 1}")
        outcome = run_workers(conc, ops, op, progress=bar.update)
        bar.close()
        raise_errors(f"peers aggregates c={conc}", outcome.errors)
        counted = sum(load(counter, f"{base}{w}", fresh=True).state.count for w in range(conc))
        self.ctx.verify(f"aggregates c={conc} round {rep + 1} increments folded", outcome.units, counted)
        self.ctx.verify(f"aggregates c={conc} round {rep + 1} events", outcome.units, streams.count_events(pfx))
        if not self.ctx.options.get("keep"):
            streams.remove(pfx)
        return outcome


# -- DBOS -----------------------------------------------------------------------------------------------


class _DbosSide:
    """DBOS Transact with its system database on our server (database `<ours>_dbos`)."""

    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self.token = secrets.token_hex(4)

    def __enter__(self):
        from dbos import DBOS

        s = connection.settings_dict
        password = f":{s['PASSWORD']}" if s["PASSWORD"] else ""
        url = (f"postgresql://{s['USER'] or 'postgres'}{password}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/"
               f"{s['NAME']}_dbos")
        self.workflow = _dbos_workflow()  # registered before DBOS() is configured and launched
        DBOS(config={"name": "loom-bench-peers", "system_database_url": url, "sys_db_pool_size": 40,
                     "log_level": "WARNING"})
        self.dbos = DBOS
        DBOS.launch()
        return self

    def __exit__(self, *exc) -> None:
        self.dbos.destroy()

    def round(self, conc: int, ops: int, rep: int):
        from dbos import SetWorkflowID

        # DBOS's system database outlives our runs (and a test database's run ids start again at 1):
        # a token makes the ids of this round new there.
        prefix = f"bench-{self.ctx.run_id}-{self.token}-peers-dbos-{conc}-{rep}-"
        before = _dbos_steps["count"]

        def op(w: int, i: int) -> int:
            with SetWorkflowID(f"{prefix}{w}-{i}"):
                if self.workflow({}) != 1:
                    raise RuntimeError("DBOS workflow returned another result")
            return 1

        bar = self.ctx.progress(conc * ops, f"DBOS c={conc} #{rep + 1}")
        outcome = run_workers(conc, ops, op, progress=bar.update)
        bar.close()
        raise_errors(f"peers DBOS c={conc}", outcome.errors)
        self.ctx.verify(f"DBOS c={conc} round {rep + 1} steps run", outcome.units, _dbos_steps["count"] - before)
        done = self.dbos.list_workflows(status="SUCCESS", workflow_id_prefix=prefix)
        self.ctx.verify(f"DBOS c={conc} round {rep + 1} workflows recorded as SUCCESS", outcome.units, len(done))
        return outcome


class _OurFlows:
    def __init__(self, ctx) -> None:
        self.ctx = ctx

    def round(self, conc: int, ops: int, rep: int):
        pfx = streams.prefix(self.ctx.run_id, "peers", "flow", conc, rep)

        def op(w: int, i: int) -> int:
            out = start("bench.noop1", {}, execution_id=f"{pfx}{w}:{i}")
            if out.status != "completed":
                raise RuntimeError(f"{out.execution_id}: {out.status} {out.error}")
            return 1

        bar = self.ctx.progress(conc * ops, f"ours flows c={conc} #{rep + 1}")
        outcome = run_workers(conc, ops, op, progress=bar.update)
        bar.close()
        raise_errors(f"peers flows c={conc}", outcome.errors)
        self.ctx.verify(f"flows c={conc} round {rep + 1} completed executions", outcome.units,
                        count_headers(pfx, "completed"))
        if not self.ctx.options.get("keep"):
            streams.remove(pfx)
            remove_headers(pfx)
        return outcome
