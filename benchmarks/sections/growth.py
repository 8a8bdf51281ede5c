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
from journal.envelopes import Envelope
from journal.models import Event
from journal.store import store_for

PER_STREAM = 10
BEHIND = 10  # drain: subscriptions behind per size
EXPIRED = 100  # sweep: expired leases per size
OPS = ("append", "load", "claim", "recovery sweep", "drain claim")


def add_arguments(parser) -> None:
    parser.add_argument("--growth-sizes", type=positive_int_list, default="100000,1000000",
                        help="Journal sizes (events) of the growth section, ascending (default 100000,1000000).")
    parser.add_argument("--growth-ops", type=positive_int, default=300,
                        help="Operations per growth cell (default 300; sweep and drain claim: a tenth).")


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
    finally:
        if not ctx.options.get("keep"):
            projections.delete_consumer(consumer)
            leases.delete_leases(pfx)
            streams.remove(pfx)
            journal.delete_executions(pfx)


def _leases():
    from leases.store import store_for as leases_store

    return leases_store()


def _projections():
    from projections.store import store_for as projections_store

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
