"""Section `privacy`: what personal data costs (docs/privacy.md). Ratios are taken within one run.

- `append`: N writers append single events of 256-byte payloads, plain vs one sealed field (AES-GCM under
  one of 100 subjects' keys, cached after the first use), interleaved repeats; recorded: median
  throughput and p50 of each, and `overhead` = sealed p50 / plain p50 - 1 (goal <= 0.15 at 8 writers).
- `load`: reading a 100-event stream (the journal's read, the one every load goes through), plain vs
  sealed (one subject): p50, statements per load (counted at the driver), overhead (goal <= 0.25).
- `forget`: one subject forgotten among `--forget-events` events (1,000 subjects): its time, its
  statements, the rows it wrote (journal events: the one audit event; key rows: one), and that none of
  the subject's event rows changed (their stored payloads compared before and after).
- `content`: loading 100 events whose payloads live in the content store: content-store calls and
  statements per load, against the same load of plain events (goal: one batched call, no statement more).
"""

from __future__ import annotations

import base64
import hashlib
import os
import statistics
import tempfile
import time

from django.test.utils import override_settings

from benchmarks import streams
from benchmarks.arguments import positive_int
from benchmarks.harness import counting_statements, run_workers
from benchmarks.recording import latency_summary
from journal.envelopes import AppendItem, Envelope
from journal.models import DataKey, Event
from journal.privacy import FORGOTTEN, declare, forget, keys
from journal.privacy import content as content_store
from journal.privacy.codec import CONTENT
from journal.store import store_for

SEALED_TYPE, PLAIN_TYPE, BIG_TYPE = "BenchSealed", "BenchPlain", "BenchBig"
SUBJECTS = 100


def add_arguments(parser) -> None:
    parser.add_argument("--privacy-writers", type=positive_int, default=8,
                        help="Writers of the privacy section's append scenario (default 8).")
    parser.add_argument("--privacy-ops", type=positive_int, default=300,
                        help="Events per writer per privacy append cell (default 300).")
    parser.add_argument("--privacy-loads", type=positive_int, default=200,
                        help="Loads of a 100-event stream per privacy load cell (default 200).")
    parser.add_argument("--privacy-repeats", type=positive_int, default=3,
                        help="Interleaved repeats of the privacy append and load cells (default 3).")
    parser.add_argument("--forget-events", type=positive_int, default=100_000,
                        help="Events in the log when the privacy section forgets one subject (default 100000).")


def _body(customer: str) -> dict:
    return {"customer_id": customer, "email": f"{customer}@example.org", "data": "x" * 180}


def run(ctx) -> None:
    declare(SEALED_TYPE, ["email"], subject="customer_id")
    master = [f"bench:{base64.b64encode(os.urandom(32)).decode()}"]
    with tempfile.TemporaryDirectory() as directory, override_settings(LOOM_KEYS=master, LOOM_CONTENT_DIR=directory):
        keys.cache.clear()
        shas: list[str] = []
        try:
            _append(ctx)
            _load(ctx)
            _forget(ctx)
            shas = _content(ctx)
        finally:
            keys.cache.clear()
            if not ctx.options.get("keep"):  # the run's key rows are wrapped by its throwaway master key
                store_for().delete_privacy_rows(streams.prefix(ctx.run_id, "privacy"), shas)


def _append(ctx) -> None:
    opts = ctx.options
    writers, ops, repeats = opts["privacy_writers"], opts["privacy_ops"], opts["privacy_repeats"]
    outcomes: dict[str, list] = {PLAIN_TYPE: [], SEALED_TYPE: []}
    order = (PLAIN_TYPE, SEALED_TYPE)
    for rep in range(repeats):
        for type_ in order if rep % 2 == 0 else order[::-1]:
            pfx = streams.prefix(ctx.run_id, "privacy", "append", type_, rep)
            bodies = [_body(f"{streams.prefix(ctx.run_id, 'privacy')}c{i}") for i in range(SUBJECTS)]

            def op(w: int, i: int, type_=type_, pfx=pfx, bodies=bodies) -> int:
                Event.objects.append(f"{pfx}{w}", Envelope(type_, bodies[(w * ops + i) % SUBJECTS]))
                return 1

            bar = ctx.progress(writers * ops, f"append {type_} rep {rep}")
            outcome = run_workers(writers, ops, op, progress=bar.update)
            bar.close()
            if outcome.errors:
                raise RuntimeError(f"privacy append {type_}: {outcome.errors[:3]}")
            ctx.verify(f"append {type_} events", outcome.units, streams.count_events(pfx))
            _clean(ctx, pfx)
            outcomes[type_].append(outcome)
    p50 = {t: statistics.median(latency_summary(o.latencies_ms)["p50_ms"] for o in runs)
           for t, runs in outcomes.items()}
    for type_, runs in outcomes.items():
        ctx.record("append", {"variant": "sealed" if type_ == SEALED_TYPE else "plain", "writers": writers},
                   throughput=statistics.median(o.throughput for o in runs), unit="events/s",
                   latencies_ms=[ms for o in runs for ms in o.latencies_ms], count=sum(o.units for o in runs),
                   runs=[round(o.throughput, 1) for o in runs],
                   overhead=round(p50[SEALED_TYPE] / p50[PLAIN_TYPE] - 1, 4) if type_ == SEALED_TYPE else None)


def _timed_loads(stream: str, loads: int, calls=lambda: 0) -> tuple[list[float], float, float]:
    """Latencies of `loads` reads of the stream on a fresh thread's connection, statements per read and
    `calls()` per read (counted around the reads only: the connection's set-up and a warm-up read are not)."""
    samples: list[float] = []
    counted = [0, 0]

    with counting_statements() as counter:
        def op(w: int, i: int) -> int:
            before, called = counter.snapshot(), calls()
            start = time.perf_counter()
            events = Event.objects.read(stream)
            samples.append((time.perf_counter() - start) * 1000)
            after = counter.snapshot()
            counted[0] += (after[0] - before[0]) - (after[1] - before[1])
            counted[1] += calls() - called
            return len(events)

        run_workers(1, loads, op, setup=lambda w: Event.objects.read(stream, limit=1))
    return samples, counted[0] / loads, counted[1] / loads


def _load(ctx) -> None:
    loads, repeats = ctx.options["privacy_loads"], ctx.options["privacy_repeats"]
    pfx = streams.prefix(ctx.run_id, "privacy", "load")
    body = _body(f"{pfx}subject")
    for type_ in (PLAIN_TYPE, SEALED_TYPE):
        Event.objects.append(f"{pfx}{type_}", [Envelope(type_, body)] * 100)
    samples: dict[str, list[float]] = {PLAIN_TYPE: [], SEALED_TYPE: []}
    p50s: dict[str, list[float]] = {PLAIN_TYPE: [], SEALED_TYPE: []}
    per_load: dict[str, float] = {}
    for rep in range(repeats):
        for type_ in (PLAIN_TYPE, SEALED_TYPE) if rep % 2 == 0 else (SEALED_TYPE, PLAIN_TYPE):
            got, per_load[type_], _ = _timed_loads(f"{pfx}{type_}", loads)
            samples[type_].extend(got)
            p50s[type_].append(latency_summary(got)["p50_ms"])
    shown = Event.objects.read(f"{pfx}{SEALED_TYPE}")
    ctx.verify("load: sealed events read back in clear", 100, sum(e.payload == body for e in shown))
    p50 = {t: statistics.median(v) for t, v in p50s.items()}
    for type_ in (PLAIN_TYPE, SEALED_TYPE):
        ctx.record("load", {"variant": "sealed" if type_ == SEALED_TYPE else "plain", "events": 100},
                   throughput=1000 / p50[type_], unit="loads/s", latencies_ms=samples[type_],
                   count=len(samples[type_]), statements_per_load=round(per_load[type_], 3),
                   overhead=round(p50[SEALED_TYPE] / p50[PLAIN_TYPE] - 1, 4) if type_ == SEALED_TYPE else None)
    _clean(ctx, pfx)


def _forget(ctx) -> None:
    total = ctx.options["forget_events"]
    pfx = streams.prefix(ctx.run_id, "privacy", "forget")
    subjects = max(1, min(1000, total // 10))
    per_stream = 10
    streams_needed = -(-total // per_stream)
    bar = ctx.progress(total, "forget: seeding")
    for start in range(0, streams_needed, 100):
        items = [AppendItem(f"{pfx}{s}", tuple(Envelope(SEALED_TYPE, _body(f"{pfx}s{s % subjects}"))
                                                for _ in range(per_stream)))
                 for s in range(start, min(streams_needed, start + 100))]
        Event.objects.append_batch(items)
        bar.update(len(items) * per_stream)
    bar.close()
    target = f"{pfx}s0"
    mine = [f"{pfx}{s}" for s in range(0, streams_needed, subjects)]
    before = _digest(mine)
    events_before, keys_before = store_for().last_event_id(), DataKey.objects.count()
    with counting_statements() as counter:
        outcome = run_workers(1, 1, lambda w, i: forget(target, by="bench") or 1)
    statements, control = counter.snapshot()
    if outcome.errors:
        raise RuntimeError(f"privacy forget: {outcome.errors}")
    events_written = store_for().last_event_id() - events_before
    ctx.verify("forget: journal events written (the audit event)", 1, events_written)
    ctx.verify("forget: key rows added (none: its row is overwritten)", 0, DataKey.objects.count() - keys_before)
    ctx.verify("forget: the subject's event rows unchanged", 1, int(_digest(mine) == before))
    ctx.verify("forget: the subject's events show the marker", len(mine) * per_stream,
               sum(e.payload["email"] == FORGOTTEN for sid in mine for e in Event.objects.read(sid)))
    ctx.record("forget", {"events": total, "subjects": subjects, "subject_events": len(mine) * per_stream},
               latencies_ms=outcome.latencies_ms, count=1, statements=statements - control,
               events_written=events_written, key_rows_written=1, event_rows_rewritten=0)
    _clean(ctx, pfx)


def _digest(stream_ids: list[str]) -> str:
    rows = Event.objects.filter(stream_id__in=stream_ids).order_by("id").values_list("id", "payload")
    return hashlib.sha256(repr(list(rows)).encode()).hexdigest()


def _content(ctx) -> list[str]:
    """The cells; returns the content references it made (their links are removed with the run's rows)."""
    pfx = streams.prefix(ctx.run_id, "privacy", "content")
    big = {"text": "y" * 4000}
    with override_settings(LOOM_CONTENT_THRESHOLD_BYTES=1024):
        for i in range(100):  # distinct content per event: 100 references, none shared
            Event.objects.append(f"{pfx}big", Envelope(BIG_TYPE, {**big, "i": i}))
        Event.objects.append(f"{pfx}plain", [Envelope(PLAIN_TYPE, {"i": i}) for i in range(100)])
        cs = content_store.store()
        cells = {}
        for name in ("plain", "big"):
            cells[name] = _timed_loads(f"{pfx}{name}", 20, lambda: cs.batches)
        shown = Event.objects.read(f"{pfx}big")
        ctx.verify("content: payloads resolved", 100, sum(e.payload == {**big, "i": e.seq} for e in shown))
    shas = [p[CONTENT] for p in Event.objects.filter(stream_id=f"{pfx}big").values_list("payload", flat=True)]
    for name, (samples, per_load, calls) in cells.items():
        ctx.record("content-load", {"variant": name, "events": 100}, latencies_ms=samples, count=len(samples),
                   statements_per_load=round(per_load, 3), content_calls_per_load=calls,
                   extra_statements=round(per_load - cells["plain"][1], 3))
    _clean(ctx, pfx)
    return shas


def _clean(ctx, pfx: str) -> None:
    if not ctx.options.get("keep"):
        streams.remove(pfx)
