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

import os
import random
import time

from benchmarks import streams
from benchmarks.arguments import positive_float, positive_int, positive_int_list
from benchmarks.harness import run_workers
from benchmarks.stats import latency_summary, median
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
    parser.add_argument("--growth-removal-variants", type=_variants_arg, default=[],
                        help="Compare removal settings within one run (instead of the rounds above): entries "
                             "joined by commas, each tokens joined by '+': 'default', 'duty=K' "
                             "(LOOM_RETENTION_DUTY), 'batch=N' (LOOM_RETENTION_BATCH), 'sync' (relaxed commit "
                             "off), 'seven' (seven DELETEs instead of one statement, PostgreSQL), "
                             "'nocursor' (each batch scans from the oldest finished_at: no run cursor). Each repeat "
                             "runs every variant in turn: a fresh settled fill, then removal in phases "
                             "(--growth-removal-phase-s) with appends running throughout; recorded per variant: "
                             "removal rate and p99 ratio "
                             "(each repeat's and their median).")
    parser.add_argument("--growth-removal-repeats", type=positive_int, default=3,
                        help="Repeats of --growth-removal-variants (interleaved: A B C A B C ...; default 3).")
    parser.add_argument("--growth-removal-phase-s", type=positive_float, default=1.0,
                        help="--growth-removal-variants: seconds of each removal phase and each pause phase between "
                             "them (default 1.0): appends in both are compared.")


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
        if ctx.options.get("growth_removal_events") and ctx.options.get("growth_removal_variants"):
            _variants(ctx, pfx, filled, ops, swept)
        elif ctx.options.get("growth_removal_events"):
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


def _variants_arg(text: str) -> list[dict]:
    """`default,duty=1,sync+batch=100` as one dict per variant ({"label", "duty", "batch", "relaxed", "seven",
    "nocursor"})."""
    import argparse

    found = []
    for entry in [e.strip() for e in str(text).split(",") if e.strip()]:
        variant: dict = {"label": entry}
        for token in entry.split("+"):
            key, _, value = token.strip().partition("=")
            try:
                if key == "default" and not value:
                    continue
                if key == "sync" and not value:
                    variant["relaxed"] = False
                elif key == "seven" and not value:
                    variant["seven"] = True
                elif key == "nocursor" and not value:
                    variant["nocursor"] = True
                elif key == "duty" and float(value) >= 0 and float(value) < float("inf"):
                    variant["duty"] = float(value)
                elif key == "batch" and int(value) >= 1:
                    variant["batch"] = int(value)
                else:
                    raise ValueError(token)
            except ValueError:
                raise argparse.ArgumentTypeError(f"{entry!r}: tokens are default, sync, seven, nocursor, "
                                                 "duty=K (K >= 0), batch=N (N >= 1)") from None
        found.append(variant)
    if not found:
        raise argparse.ArgumentTypeError("at least one variant")
    return found


def _variants(ctx, pfx: str, filled: int, ops: int, swept: set[str]) -> None:
    """Removal settings compared within one run, interleaved (repeat 1: A B C, repeat 2: A B C, ...). Per
    variant and repeat: a fresh settled fill (`{pfx}v<repeat>_<variant>_<n>`, spread as in _removal), a
    checkpoint, then removal (one clock, checked against what was due) in alternating phases: batches for
    --growth-removal-phase-s seconds (the variant's own pauses included), then none for as long, until nothing
    is due; meanwhile one caller appends without pause. An append that starts inside a removal phase counts as
    "removal running", one that starts in a pause phase after its first 0.3 * phase (what the last batch left
    for the WAL writer) as "no removal": both come from the same seconds of this shared machine, so a burst of
    someone else's load lands in both (the ratio compares like with like). The removal rate is the events over
    the removal phases' time: what removal under this setting achieves while it runs."""
    import threading

    from django.db import connections
    from django.test import override_settings
    from django.utils import timezone

    variants, repeats = ctx.options["growth_removal_variants"], ctx.options.get("growth_removal_repeats", 3)
    phase_s = ctx.options.get("growth_removal_phase_s", 1.0)
    events, days = ctx.options["growth_removal_events"], ctx.options["growth_removal_days"]
    count = max(1, events // PER_STREAM)
    store = retention_store_for()
    env = Envelope("BenchEvent", {"data": "growth"})
    targets = [f"{pfx}{n}" for n in range(filled) if f"{pfx}{n}" not in swept]
    pick = random.Random(1)
    results: dict[str, list[dict]] = {v["label"]: [] for v in variants}
    pooled: dict[str, tuple[list, list]] = {v["label"]: ([], []) for v in variants}
    for repeat in range(repeats):
        for index, variant in enumerate(variants):
            vpfx = f"{pfx}v{repeat}_{index}_"
            label = f"growth removal variant {variant['label']} repeat {repeat + 1}"
            began = time.perf_counter()
            _fill_settled(ctx, store, vpfx, count, days, label)
            fill_s = time.perf_counter() - began
            store.checkpoint()
            sizes_filled = store.table_sizes()
            batch = variant.get("batch", _batch(ctx, 1))
            with override_settings(LOOM_RETENTION_DAYS=None,
                                   LOOM_RETENTION_FLOWS=[f"{SETTLED_FLOW}={RETENTION_DAYS}"],
                                   LOOM_RETENTION_BATCH=batch, LOOM_ARCHIVE_FLOWS=[],
                                   LOOM_RETENTION_DUTY=variant.get("duty", 0.0),
                                   LOOM_RETENTION_RELAXED_COMMIT=variant.get("relaxed", True)):
                at = timezone.now()
                (group,) = retention.groups(at)
                due = store.due(group.cutoff, group.flows)
                done: dict = {"batches": 0, "executions": 0, "events": 0, "on_s": 0.0}
                phases: list[tuple[float, float]] = []  # removal phases (perf_counter start, end)
                seven, nocursor = bool(variant.get("seven")), bool(variant.get("nocursor"))

                def remove(done=done, at=at, seven=seven, nocursor=nocursor, phases=phases, due=due,
                           label=label) -> None:
                    # the benchmark's own switch: the seven-statement deletes of the same store (an attribute
                    # of this alias's one store instance, which remove_batch uses; put back when removal ends)
                    if seven:
                        store.DELETE_ROWS_ONE = ""
                    try:
                        finished = False
                        told = time.perf_counter()
                        cursor: dict = {}  # one run of batches, cut into phases: each batch goes on from the last
                        while not finished:
                            t0 = time.perf_counter()
                            while time.perf_counter() - t0 < phase_s:
                                got = retention.run(store.alias, now=at, max_batches=1,
                                                    cursor=None if nocursor else cursor)
                                if not got["batches"]:
                                    finished = True
                                    break
                                for key in ("batches", "executions", "events"):
                                    done[key] += got[key]
                            phases.append((t0, time.perf_counter()))
                            if time.perf_counter() - told >= PROGRESS_S:  # a long run says where it is
                                told = time.perf_counter()
                                ctx.log(f"{label}: removed {done['executions']:,} of {due:,} executions due "
                                        f"({done['batches']:,} batches, load {os.getloadavg()[0]:.1f})")
                            if not finished:
                                time.sleep(phase_s)
                    finally:
                        if seven:
                            del store.DELETE_ROWS_ONE
                        connections.close_all()

                remover = threading.Thread(target=remove, name="bench-removal")
                samples: list[tuple[float, float]] = []  # (start, ms)
                remover.start()
                while remover.is_alive():
                    t0 = time.perf_counter()
                    Event.objects.append(pick.choice(targets), env, fence_token=1)
                    samples.append((t0, (time.perf_counter() - t0) * 1000))
                remover.join()
            ctx.verify(f"growth removal variant {variant['label']} repeat {repeat + 1}: executions removed", due,
                       done["executions"])
            sizes_removed = store.table_sizes()
            began = time.perf_counter()
            store.vacuum()
            vacuum_s = time.perf_counter() - began
            sizes_vacuumed = store.table_sizes()
            quiet, during = _by_phase(samples, phases, 0.3 * phase_s)
            on_s = sum(end - begin for begin, end in phases)
            q, d = latency_summary(quiet)["p99_ms"], latency_summary(during)["p99_ms"]
            results[variant["label"]].append({
                "repeat": repeat + 1, "batch": batch, "executions": done["executions"], "events": done["events"],
                "batches": done["batches"], "removal_s": round(on_s, 2),
                "events_per_s": round(done["events"] / on_s, 1) if on_s else None,
                "executions_per_s": round(done["executions"] / on_s, 1) if on_s else None,
                "p99_quiet_ms": round(q, 2), "p99_during_ms": round(d, 2), "p99_ratio": round(d / q, 3) if q else None,
                "appends_quiet": len(quiet), "appends_during": len(during), "load_1m": round(os.getloadavg()[0], 2),
                "p50_quiet_ms": round(latency_summary(quiet)["p50_ms"], 2),
                "p50_during_ms": round(latency_summary(during)["p50_ms"], 2),
                "fill_s": round(fill_s, 2), "vacuum_s": round(vacuum_s, 2), "sizes_filled": sizes_filled,
                "sizes_removed": sizes_removed, "sizes_vacuumed": sizes_vacuumed})
            pooled[variant["label"]][0].extend(quiet)
            pooled[variant["label"]][1].extend(during)
            ctx.log(f"{label}: {results[variant['label']][-1]}")
    params = {"events": count * PER_STREAM, "days": days, "retention_days": RETENTION_DAYS, "running": filled,
              "repeats": repeats, "phase_s": phase_s}
    for variant in variants:
        label, found = variant["label"], results[variant["label"]]
        ratios = [r["p99_ratio"] for r in found if r["p99_ratio"]]
        quiet, during = pooled[label]
        pooled_ratio = latency_summary(during)["p99_ms"] / latency_summary(quiet)["p99_ms"] if quiet else None
        ctx.record(f"removal [{label}]", params, throughput=median([r["events_per_s"] for r in found]),
                   unit="events/s", executions_per_s=median([r["executions_per_s"] for r in found]),
                   p99_ratio=round(median(ratios), 3) if ratios else None,
                   p99_ratio_pooled=round(pooled_ratio, 3) if pooled_ratio else None, repeats=found)
        ctx.record(f"append, no removal [{label}]", params, throughput=None, unit="ops/s", latencies_ms=quiet,
                   count=len(quiet))
        ctx.record(f"append, removal running [{label}]", params, throughput=None, unit="ops/s",
                   latencies_ms=during, count=len(during))


PROGRESS_S = 30.0  # seconds between a long fill's or removal's progress lines


def _fill_settled(ctx, store, pfx: str, count: int, days: float, label: str) -> None:
    """`count` settled executions (`{pfx}<n>`) spread over `days`, in loads of 100,000 (one transaction each), with
    a progress line every PROGRESS_S seconds: the issue's 10^7 events take a quarter of an hour to load."""
    told = time.perf_counter()
    for start in range(0, count, 100_000):
        store.fill_settled(pfx, start, min(100_000, count - start), PER_STREAM, '{"data":"filled"}', days,
                           SETTLED_FLOW)
        if time.perf_counter() - told >= PROGRESS_S:
            told = time.perf_counter()
            ctx.log(f"{label}: filled {min(count, start + 100_000):,} of {count:,} executions "
                    f"(load {os.getloadavg()[0]:.1f})")


def _by_phase(samples: list[tuple[float, float]], phases: list[tuple[float, float]],
              guard: float) -> tuple[list[float], list[float]]:
    """(latencies of appends started in a pause phase, past its first `guard` seconds; of appends started in a
    removal phase). Appends before the first phase or in a guard are left out."""
    quiet: list[float] = []
    during: list[float] = []
    edges = sorted(phases)
    for started, ms in samples:
        for i, (begin, end) in enumerate(edges):
            if begin <= started < end:
                during.append(ms)
                break
            following = edges[i + 1][0] if i + 1 < len(edges) else float("inf")
            if end + guard <= started < following:
                quiet.append(ms)
                break
    return quiet, during
