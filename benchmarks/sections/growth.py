"""Section `growth`: how the cost of one operation grows with what the database already holds.

The journal is pre-filled, size by size (`--growth-sizes`, default 10^5 and 10^6 events; 10^7 with
`--growth-sizes 100000,1000000,10000000`), by the stores' bulk loader (COPY on PostgreSQL, one
executemany in one transaction on SQLite): streams of 10 events, each with its fence (token 1) and a
running execution header. Each size adds to the previous fill, then measures, one caller:
- append: a fenced one-event `Event.objects.append` to a random filled stream;
- load: `Event.objects.read` of a random filled stream (its 10+ events);
- claim: the leases store's acquire of a random filled execution at its fence, then its release
  (the lease claim joins the journal's fence table);
- recovery sweep: one leases takeover over every filled execution (size/10: 10^5 at 10^6 events),
  all leased live but the 100 of this size's fill, which are expired: the sweep must take exactly
  those 100;
- drain claim: one projections claim over one subscription per filled stream, all caught up but
  the 10 of this size's fill: the claim must find exactly those 10 (then released), repeated.
After each fill the database is checkpointed (`checkpoint_s`; PostgreSQL's CHECKPOINT needs superuser or
pg_checkpoint, else a note says the cells ran during the write-out). Recorded per cell: per-op cost
(`per_op_us`), the size, the fill time; the largest size's cell of
each operation also records `growth_ratio` = its per-op cost ÷ the smallest size's (the goal: at
most 1.3 from 10^5 to 10^7). The plans that keep it flat are named in docs/benchmarks.md.
"""

from __future__ import annotations

import random
import time

from benchmarks import streams
from benchmarks.arguments import positive_int, positive_int_list
from benchmarks.harness import run_workers
from journal import retention
from journal.envelopes import Envelope
from journal.models import Event
from journal.store import retention_store_for, store_for
from leases.store import store_for as leases_store
from projections.store import store_for as projections_store

PER_STREAM = 10
BEHIND = 10  # drain: subscriptions behind per size
EXPIRED = 100  # sweep: expired leases per size
OPS = ("append", "load", "claim", "recovery sweep", "drain claim")


def add_arguments(parser) -> None:
    parser.add_argument("--growth-sizes", type=positive_int_list, default="100000,1000000",
                        help="Journal sizes (events) of the growth section, ascending (default 100000,1000000).")
    parser.add_argument("--growth-ops", type=positive_int, default=300,
                        help="Operations per growth cell (default 300; sweep and drain claim: a tenth).")
    parser.add_argument("--growth-removal-events", type=int, default=0,
                        help="Also measure retention (0: off): pre-fill this many events of settled executions "
                             "spread over --growth-removal-days, remove those past 30 days while appends run "
                             "(the issue's size: 10000000).")
    parser.add_argument("--growth-removal-days", type=positive_int, default=400,
                        help="Days the settled fill is spread over (default 400).")
    parser.add_argument("--growth-removal-rounds", type=positive_int, default=2,
                        help="Intake rounds of the removal cells (default 2): after the first, the same amount in "
                             "again, removal and VACUUM again, each round's sizes over the first's (flatness).")
    parser.add_argument("--growth-removal-batch", type=positive_int_list, default=[500],
                        help="LOOM_RETENTION_BATCH of the removal cells (default 500 executions); a list "
                             "(500,2000): round n uses the list's entry n mod its length, to compare batch sizes "
                             "within one run.")


def run(ctx) -> None:
    sizes = sorted(set(ctx.options["growth_sizes"]))
    ops = ctx.options["growth_ops"]
    pfx = streams.prefix(ctx.run_id, "growth")
    owner, consumer, lane = f"{pfx}owner", f"{pfx}consumer", f"{pfx}lane"
    journal, leases, projections = store_for(), _leases(), _projections()
    first: dict[str, float] = {}
    filled = 0
    swept: set[str] = set()  # executions taken over by a sweep: their fence moved on (token 2)
    try:
        for size in sizes:
            count = max(1, size // PER_STREAM)
            if count <= filled:
                continue
            began = time.perf_counter()
            journal.fill_growth(pfx, filled, count - filled, PER_STREAM, '{"data":"filled"}')
            fresh = [f"{pfx}{n}" for n in range(filled, count)]
            # At most a tenth of a fill expired (or behind): a small fill keeps live executions to append to
            # and claim (with 100 expired of 100, those cells had nothing left to measure).
            n_expired = max(1, min(EXPIRED, len(fresh) // 10))
            expired = set(fresh[:: max(1, len(fresh) // n_expired)][:n_expired])
            leases.fill_leases(owner, [e for e in fresh if e not in expired], 1, 3600)
            leases.fill_leases(owner, sorted(expired), 1, -60)
            n_behind = max(1, min(BEHIND, len(fresh) // 10))
            behind = set(fresh[:: max(1, len(fresh) // n_behind)][:n_behind])
            projections.insert_caught_up([(consumer, sid, lane, 0, 0, 1 if sid in behind else 0) for sid in fresh])
            projections.analyze_subscriptions()
            fill_s = time.perf_counter() - began
            began = time.perf_counter()
            unsettled = journal.checkpoint()  # the fill written out before anything is timed
            if unsettled:
                ctx.log(f"growth: no checkpoint after the {size:,}-event fill ({unsettled}): its cells are "
                         "measured while the database still writes the fill out")
            checkpoint_s = time.perf_counter() - began
            filled = count
            swept |= expired
            cells = {
                "recovery sweep": _sweep(ctx, leases, owner, size, len(expired)),
                "append": _append(pfx, filled, ops, swept),
                "load": _load(pfx, filled, ops),
                "claim": _claim(ctx, leases, pfx, [e for e in fresh if e not in expired], ops),
                "drain claim": _drain(ctx, projections, consumer, lane, size, len(behind), max(2, ops // 10)),
            }
            for name in OPS:
                outcome = cells[name]
                per_op = 1e6 / outcome.throughput if outcome.throughput else None
                first.setdefault(name, per_op)
                largest = size == sizes[-1] and len(sizes) > 1
                ctx.record(name, {"events": filled * PER_STREAM, "executions": filled, "subscriptions": filled},
                           throughput=outcome.throughput, unit="ops/s", latencies_ms=outcome.latencies_ms,
                           count=outcome.units, per_op_us=round(per_op, 1) if per_op else None,
                           fill_s=round(fill_s, 2), checkpoint_s=None if unsettled else round(checkpoint_s, 2),
                           growth_ratio=round(per_op / first[name], 3) if largest and per_op and first[name] else None)
        if ctx.options.get("growth_removal_events"):
            _removal(ctx, pfx, filled, ops, swept)
    finally:
        if not ctx.options.get("keep"):
            journal.delete_streams(f"{pfx}s")
            journal.delete_executions(f"{pfx}s")
            projections.delete_consumer(consumer)
            leases.delete_leases(pfx)
            streams.remove(pfx)
            journal.delete_executions(pfx)


def _leases():
    return leases_store()


def _projections():
    return projections_store()


def _append(pfx: str, filled: int, ops: int, swept: set[str]):
    env = Envelope("BenchEvent", {"data": "growth"})
    picks = [n for n in random.Random(1).sample(range(filled), min(ops + len(swept), filled))
             if f"{pfx}{n}" not in swept][:ops]

    def op(w: int, i: int) -> int:
        Event.objects.append(f"{pfx}{picks[i % len(picks)]}", env, fence_token=1)
        return 1
    return _timed(op, len(picks))


def _load(pfx: str, filled: int, ops: int):
    picks = random.Random(2).sample(range(filled), min(ops, filled))

    def op(w: int, i: int) -> int:
        if not Event.objects.read(f"{pfx}{picks[i]}"):
            raise RuntimeError("growth: a filled stream read empty")
        return 1
    return _timed(op, len(picks))


def _claim(ctx, leases, pfx: str, live: list[str], ops: int):
    """Acquire then release a lease on an execution of this size's fill (live lease, fence token 1:
    its fill lease is dropped first, untimed, so that the acquire has a row to write)."""
    picks = random.Random(3).sample(live, min(ops, len(live)))
    owner = f"{pfx}claimer"
    for eid in picks:
        leases.delete_leases(eid)
    acquired: list[str] = []

    def op(w: int, i: int) -> int:
        item = (picks[i], 1)
        acquired.extend(leases.acquire_many(owner, [item], 30.0))
        leases.release_many(owner, [item])
        return 1
    outcome = _timed(op, len(picks))
    ctx.verify(f"growth {len(live)}: claims acquired", len(picks), len(acquired))
    return outcome


def _sweep(ctx, leases, owner: str, size: int, expired: int):
    """One takeover over every filled execution; exactly this size's expired leases are taken."""
    taken: list = []

    def op(w: int, i: int) -> int:
        # The sweeper's leases last an hour: a later size's sweep must not find them expired again
        # (the fill of 10^7 events takes longer than a short TTL).
        result = leases.takeover(f"{owner}-sweeper", 3600.0, orphan_after=86400.0, max_attempts=10,
                                 limit=expired + 10, flows=["bench.growth"])
        taken.extend(result.taken)
        return 1
    outcome = _timed(op, 1)
    ctx.verify(f"growth {size}: executions the sweep took (its expired leases)", expired, len(taken))
    return outcome


def _drain(ctx, projections, consumer: str, lane: str, size: int, behind: int, repeats: int):
    """Claim (then release) the lane's behind subscriptions, `repeats` times: always exactly `behind`."""
    found: list[int] = []

    def op(w: int, i: int) -> int:
        claims = projections.claim(lane, [consumer], "growth", 100, 30.0)
        found.append(len(claims))
        projections.release(claims, "growth")
        return 1
    outcome = _timed(op, repeats)
    ctx.verify(f"growth {size}: subscriptions each drain claim found", [behind] * repeats, found)
    claims = projections.claim(lane, [consumer], "growth", 100, 30.0)  # caught up: the next size adds its own
    ctx.verify(f"growth {size}: subscriptions caught up", len(claims),
               len(projections.ack([(c, c.tip) for c in claims], "growth")))
    return outcome


def _timed(op, ops: int):
    outcome = run_workers(1, ops, op)
    if outcome.errors:
        raise RuntimeError(f"growth: {outcome.errors[:3]}")
    return outcome


RETENTION_DAYS = 30
SETTLED_FLOW = "bench.growth.settled"


def _removal(ctx, pfx: str, filled: int, ops: int, swept: set[str]) -> None:
    """Retention under load: settled executions spread over N days (`{pfx}s<n>`, of their own flow, the only
    flow with a retention here), removed past 30 days by journal.retention.run while one caller appends to the
    running filled streams; appends without removal first (same streams, same caller). Recorded: the removal
    rate (events/s), both appends' latencies, the tables' sizes before, after removal, after VACUUM."""
    import threading

    from django.db import connections
    from django.test import override_settings
    from django.utils import timezone

    events, days = ctx.options["growth_removal_events"], ctx.options["growth_removal_days"]
    count = max(1, events // PER_STREAM)
    store = retention_store_for()
    began = time.perf_counter()
    for start in range(0, count, 100_000):
        store.fill_settled(f"{pfx}s", start, min(100_000, count - start), PER_STREAM, '{"data":"filled"}', days,
                           SETTLED_FLOW)
    fill_s = time.perf_counter() - began
    store.checkpoint()
    sizes_filled = store.table_sizes()
    params = {"events": count * PER_STREAM, "days": days, "retention_days": RETENTION_DAYS, "running": filled}
    with override_settings(LOOM_RETENTION_DAYS=None, LOOM_RETENTION_FLOWS=[f"{SETTLED_FLOW}={RETENTION_DAYS}"],
                           LOOM_RETENTION_BATCH=_batch(ctx, 1), LOOM_ARCHIVE_FLOWS=[]):
        # One clock for the whole removal: what was due at its start is what it removes (with the clock moving
        # on, executions that cross the 30-day line during a long run would be removed too).
        at = timezone.now()
        (group,) = retention.groups(at)
        due = store.due(group.cutoff, group.flows)
        quiet = _append(pfx, filled, ops, swept)
        done: dict = {}

        def remove() -> None:
            t0 = time.perf_counter()
            try:
                done.update(retention.run(store.alias, now=at))
            finally:
                done["s"] = time.perf_counter() - t0
                connections.close_all()

        remover = threading.Thread(target=remove, name="bench-removal")
        remover.start()
        during: list[float] = []
        rounds = 0
        while remover.is_alive() or rounds == 0:
            during += _append(pfx, filled, ops, swept).latencies_ms
            rounds += 1
        remover.join()
    ctx.verify(f"growth removal: executions removed (due past {RETENTION_DAYS} days)", due, done.get("executions"))
    sizes_removed = store.table_sizes()
    began = time.perf_counter()
    store.vacuum()
    vacuum_s = time.perf_counter() - began
    sizes_vacuumed = store.table_sizes()
    later = [_next_round(ctx, retention, store, f"{pfx}r{n}_", count, days, _batch(ctx, n))
             for n in range(2, ctx.options.get("growth_removal_rounds", 2) + 1)]
    rate = done["events"] / done["s"] if done["s"] else None
    ctx.record("removal", params, throughput=round(rate, 1) if rate else None, unit="events/s",
               count=done["events"], executions_per_s=round(done["executions"] / done["s"], 1) if done["s"] else None,
               batches=done["batches"], batch=_batch(ctx, 1), fill_s=round(fill_s, 2), vacuum_s=round(vacuum_s, 2),
               sizes_filled=sizes_filled, sizes_removed=sizes_removed, sizes_vacuumed=sizes_vacuumed,
               later_rounds=later, vs_round1=[_ratios(r["sizes_vacuumed"], sizes_vacuumed) for r in later])
    ctx.record("append, no removal", params, throughput=quiet.throughput, unit="ops/s",
               latencies_ms=quiet.latencies_ms, count=quiet.units)
    ctx.record("append, removal running", params, throughput=None, unit="ops/s", latencies_ms=during,
               count=len(during), rounds=rounds)


def _batch(ctx, round_: int) -> int:
    """The removal batch of round `round_` (1-based): --growth-removal-batch's entries in turn."""
    chosen = ctx.options["growth_removal_batch"]
    chosen = chosen if isinstance(chosen, list) else [chosen]
    return chosen[(round_ - 1) % len(chosen)]


def _next_round(ctx, retention, store, pfx: str, count: int, days: float, batch: int) -> dict:
    """Sizes flat once retention is reached: the same intake again (`{pfx}<n>`, the same spread over `days`)
    into the vacuumed tables, removal again (its own clock), VACUUM again. If removal keeps the journal at
    its retention, the second round's sizes after VACUUM are the first's (the freed space is reused)."""
    from django.test import override_settings
    from django.utils import timezone

    began = time.perf_counter()
    for start in range(0, count, 100_000):
        store.fill_settled(pfx, start, min(100_000, count - start), PER_STREAM, '{"data":"filled"}', days,
                           SETTLED_FLOW)
    fill_s = time.perf_counter() - began
    sizes_filled = store.table_sizes()
    with override_settings(LOOM_RETENTION_DAYS=None, LOOM_RETENTION_FLOWS=[f"{SETTLED_FLOW}={RETENTION_DAYS}"],
                           LOOM_RETENTION_BATCH=batch, LOOM_ARCHIVE_FLOWS=[]):
        at = timezone.now()
        (group,) = retention.groups(at)
        due = store.due(group.cutoff, group.flows)  # round 2's old ones and round 1's that crossed the line since
        t0 = time.perf_counter()
        done = retention.run(store.alias, now=at)
        removal_s = time.perf_counter() - t0
    ctx.verify(f"growth removal round {pfx}: executions removed (due past {RETENTION_DAYS} days)", due,
               done["executions"])
    sizes_removed = store.table_sizes()
    store.vacuum()
    return {"batch": batch, "events": done["events"], "executions": done["executions"], "batches": done["batches"],
            "events_per_s": round(done["events"] / removal_s, 1) if removal_s else None,
            "fill_s": round(fill_s, 2), "sizes_filled": sizes_filled, "sizes_removed": sizes_removed,
            "sizes_vacuumed": store.table_sizes()}


def _ratios(after: dict | None, before: dict | None) -> dict | None:
    """Each size of a later round over round 1 (after VACUUM): 1.0 is flat."""
    if not after or not before:
        return None
    return {key: round(after[key] / before[key], 3) if before[key] else None for key in after}
