"""Section `schedules`: how late a schedule's tick starts, with many schedules (docs/schedules.md).

Method: `--schedule-count` schedules (1,000 by default) of a one-step flow, each every minute at its
own second, spread over the next `--schedule-seconds` seconds, so that each fires once in the window
(about count/seconds ticks per second). `--schedule-tickers` threads play the workers: each runs
`leases.schedules.tick()` every `--schedule-every` seconds (LOOM_SCHEDULE_EVERY's role), as a
loom_worker's schedule service does. A tick's lateness is the time from the tick (the cron instant)
until the tick's start (its queued execution and entry, issue #24) has COMMITTED, read on this host's
clock right after `tick()` returned: so it includes the wait for the next tick of a ticker (about
half of `--schedule-every` on average), the claim, the starts and the commit. Reported: p50/p95/p99/max
lateness (ms) and the ticks started per second of window.

Verified against the database: every schedule started exactly one execution in the window (its
queue entry: `sched:<name>:<tick>`), and no tick twice. The executions are only queued (no
dispatcher runs them): what is measured is the scheduler, not the flow. The section's schedules, their
queued executions and entries are deleted afterwards.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

from django.db import connections

from benchmarks import streams
from benchmarks.arguments import positive_float, positive_int
from journal.flows import flow
from journal.store import store_for as journal_store
from leases import schedules as sc
from leases.store import store_for as lease_store
from queues.store import store_for as queue_store


@flow("bench.schedules.noop")
def noop(ctx, value):
    return ctx.step("noop", lambda: 1)


def add_arguments(parser) -> None:
    parser.add_argument("--schedule-count", type=positive_int, default=1000, help="Schedules (default 1000).")
    parser.add_argument("--schedule-seconds", type=positive_int, default=30,
                        help="Window over which their ticks are spread, at most 60 (default 30).")
    parser.add_argument("--schedule-tickers", type=positive_int, default=2,
                        help="Threads ticking the schedules, like that many workers (default 2).")
    parser.add_argument("--schedule-every", type=positive_float, default=1.0,
                        help="Seconds between a ticker's ticks (LOOM_SCHEDULE_EVERY's default: 1.0).")


def run(ctx) -> None:
    count, window = ctx.options["schedule_count"], min(ctx.options["schedule_seconds"], 60)
    tickers, every = ctx.options["schedule_tickers"], ctx.options["schedule_every"]
    name_prefix = streams.prefix(ctx.run_id, "sched").replace(":", "-").replace("/", "-")
    # The first tick after the definitions are written (about 5 ms each); each schedule's first tick is
    # computed from `begin`, so a slow definition makes its tick late (measured), never a minute later.
    begin = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=2 + count * 0.005)
    for i in range(count):
        second = (begin.second + i % window) % 60
        sc.define(f"{name_prefix}{i}", f"{second} * * * * *", noop, {"i": i}, catch_up="once", source="bench",
                  now=begin - timedelta(seconds=1))
    end = begin + timedelta(seconds=window + 2 * every + 1)
    lateness_ms: list[float] = []
    ids: list[str] = []
    lock = threading.Lock()
    bar = ctx.progress(count, f"{count} schedules, {tickers} tickers")

    def ticker() -> None:
        try:
            while datetime.now(UTC) < end:
                started = sc.tick(flows=[noop.name])
                done = datetime.now(UTC)
                mine = [s for s in started if s.schedule.startswith(name_prefix)]
                with lock:
                    lateness_ms.extend((done - s.tick).total_seconds() * 1000 for s in mine)
                    ids.extend(s.execution_id for s in mine)
                bar.update(len(mine))
                time.sleep(every)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=ticker, name=f"bench-ticker-{i}") for i in range(tickers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    bar.close()
    prefix = f"{sc.ID_PREFIX}{name_prefix}"  # every tick id of the section's schedules
    queued = queue_store().count_entries(prefix, "pending")  # each tick: a queued execution (issue #24)
    ctx.verify("ticks started once each", len(set(ids)), len(ids))
    ctx.verify("ticks started (one per schedule in the window)", count, len(set(ids)))
    ctx.verify("queued executions of the started ticks", len(ids), queued)
    ctx.record("tick lateness", {"schedules": count, "window_s": window, "tickers": tickers, "every_s": every,
                                 "vendor": ctx.vendor},
               throughput=len(ids) / window, unit="ticks/s", latencies_ms=lateness_ms, count=len(ids))
    if not ctx.options.get("keep"):
        queue_store().delete_entries(prefix)
        journal_store().delete_streams(prefix)
        journal_store().delete_executions(prefix)
        lease_store().delete_schedules(name_prefix)
