"""Re-snapshot: fresh snapshots taken by the current code, for the streams whose snapshot an older code took.

    manage.py loom aggregates resnapshot [--state NAME] [--stream ID] [--all] [--dry-run] [--batch N]

When an aggregate's code changes (a new field, a new fold), a snapshot the old code took may no longer fit the
state's schema: the loader then replays the stream from seq 0 (slow on a long stream), or, for a compacted stream,
refuses with CompactedStream (its events before the snapshot are gone). This re-takes, for each such stream, a
snapshot folded from seq 0 by the code of this process; `everything` (`--all`) does it for every stream that has a
snapshot (a fold changed while the schema did not: the old snapshot fits but holds what the old fold computed).

The fence against appends: a snapshot at seq N claims "the fold of events 0..N" and nothing else. The fold reads
the stream once (its events up to the newest committed), the snapshot is written at the seq of the last event it
folded (N), never at the stream's tip read later; an append racing it lands at seq > N and is read after the
snapshot as any tail is: never lost, never folded twice. The write replaces a snapshot at N (journal/store/
retention.py RESNAPSHOT; the runtime's save_snapshot keeps an existing one), in a transaction that first checks
the stream still starts at seq 0 (a compaction meanwhile: the fold from 0 could not be repeated, and it is reported
as compacted). A snapshot that does not fit written meanwhile by a process on the old code, above ours, is seen
after the write and the stream refolded (three times at most; then it is reported: deploy the new code first).

Never re-snapshotted: a sensitive state (it is never snapshotted: docs/privacy.md; skipped, and said so), a stream
with no snapshot (it replays from seq 0 with the current code already), a compacted stream whose snapshot no longer
fits (refused, with what to do: it cannot be refolded), a flow's stream (an execution header: not an aggregate's).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime

from django.utils import timezone
from pydantic import ValidationError

from journal import shards
from journal.aggregates.declarations import State, states
from journal.aggregates.errors import AggregateError, CompactedStream
from journal.aggregates.runtime import replay
from journal.atomic import atomic
from journal.store import retention_store_for

ATTEMPTS = 3  # folds of one stream when a snapshot that does not fit keeps appearing above ours
SENSITIVE = "sensitive: never snapshotted (docs/privacy.md), it loads from its sealed events; nothing to re-take"
WHAT_TO_DO = ("make the state's schema accept the old snapshot (defaults for the new fields, or a "
              "model_validator(mode='before') that upgrades the old shape) and run resnapshot again, or restore "
              "its events from a backup")


class UnknownTarget(LookupError):
    """--state names no declared state, or --stream no stream of one."""


@dataclass
class Outcome:
    """What was done (or, in a dry run, would be) for one stream.

    action: "resnapshotted", "would resnapshot", "fits" (kept), "skipped" (nothing to do, `reason` says why),
    "refused" (a compacted stream whose snapshot does not fit: `reason` says what to do), "failed" (the current
    code does not fold its events, or old-code snapshots kept appearing)."""

    stream: str
    state: str
    alias: str
    action: str
    seq: int | None = None  # the new snapshot's seq (the old one's for fits/skipped/refused)
    reason: str = ""

    @property
    def problem(self) -> bool:
        return self.action in ("refused", "failed")


@dataclass
class Report:
    checked: int = 0
    outcomes: list[Outcome] = field(default_factory=list)  # every stream but those whose snapshot fits
    fits: int = 0
    skipped_states: dict[str, str] = field(default_factory=dict)
    unreachable: dict[str, str] = field(default_factory=dict)

    def count(self, action: str) -> int:
        return sum(1 for o in self.outcomes if o.action == action)

    def as_json(self) -> dict:
        return {"checked": self.checked, "fits": self.fits,
                **{key: self.count(action) for key, action in (("resnapshotted", "resnapshotted"),
                                                                ("would_resnapshot", "would resnapshot"),
                                                                ("refused", "refused"), ("failed", "failed"))},
                "streams": [asdict(o) for o in self.outcomes], "skipped_states": self.skipped_states,
                "unreachable": sorted(self.unreachable)}


def _fits(st: State, state: object) -> bool:
    try:
        st.schema.model_validate(state)
    except ValidationError:
        return False
    return True


def owner(stream: str) -> State | None:
    """The declared state a stream id belongs to: the longest prefix it starts with (`A-` and `A-b-` both match
    `A-b-1`, which is `A-b`'s)."""
    found = [st for st in states().values() if stream.startswith(st.prefix) and len(stream) > len(st.prefix)]
    return max(found, key=lambda st: len(st.prefix), default=None)


def resnapshot_stream(st: State, stream: str, alias: str, *, everything: bool = False, dry_run: bool = False,
                      now: datetime | None = None) -> Outcome:
    """Re-take the snapshot of one stream (on `alias`, its shard) if its newest one does not fit (or always)."""
    if st.sensitive:
        return Outcome(stream, st.name, alias, "skipped", reason=SENSITIVE)
    store = retention_store_for(alias)
    with shards.bound(alias):
        if store.exists(stream):  # an execution header or fence: a flow's log, never an aggregate's
            return Outcome(stream, st.name, alias, "skipped", reason="a flow's stream, not an aggregate's")
        for _ in range(ATTEMPTS):
            newest = store.newest_snapshot(stream)
            if newest is None:
                return Outcome(stream, st.name, alias, "skipped",
                               reason="no snapshot: it replays from seq 0 with the current code already")
            old_seq, old_state = newest
            fits = _fits(st, old_state)
            if fits and not everything:
                return Outcome(stream, st.name, alias, "fits", old_seq)
            first = store.first_seq(stream)
            if first:  # compacted before `first`: no fold from seq 0 is possible any more
                return _compacted(st, stream, alias, first, old_seq, fits)
            try:
                agg = replay(st, stream[len(st.prefix):], use_snapshot=False)
            except CompactedStream as exc:  # compacted while we read it
                return _compacted(st, stream, alias, exc.first_seq, old_seq, fits)
            except AggregateError as exc:
                return Outcome(stream, st.name, alias, "failed", old_seq,
                               f"the current code does not fold its events: {exc}")
            if agg.version < 0:
                return Outcome(stream, st.name, alias, "skipped", old_seq, "no events")
            if dry_run:
                return Outcome(stream, st.name, alias, "would resnapshot", agg.version,
                               "" if fits else f"its snapshot at seq {old_seq} no longer fits {st.name}'s schema")
            with atomic(alias):
                first = store.first_seq(stream)
                if first:
                    compacted_meanwhile = first
                else:
                    compacted_meanwhile = 0
                    store.resnapshot(stream, agg.version, agg.state.model_dump(mode="json"), now or timezone.now())
                    after = store.newest_snapshot(stream)
            if compacted_meanwhile:
                return _compacted(st, stream, alias, compacted_meanwhile, old_seq, fits)
            if after is not None and (after[0] == agg.version or _fits(st, after[1])):
                return Outcome(stream, st.name, alias, "resnapshotted", agg.version)
            # a snapshot above ours that does not fit: a process on the old code took it meanwhile; fold again
    return Outcome(stream, st.name, alias, "failed", reason=f"a snapshot that does not fit {st.name}'s schema kept "
                   f"appearing above ours ({ATTEMPTS} folds): a process still runs the old code; deploy the new "
                   "code everywhere, then run resnapshot again")


def _compacted(st: State, stream: str, alias: str, first: int, old_seq: int, fits: bool) -> Outcome:
    if fits:
        return Outcome(stream, st.name, alias, "skipped", old_seq,
                       f"compacted before seq {first}: it cannot be refolded from seq 0 (those events were "
                       "deleted); its snapshot fits the schema and is kept")
    return Outcome(stream, st.name, alias, "refused", old_seq,
                   f"compacted before seq {first} and its snapshot at seq {old_seq} no longer fits {st.name}'s "
                   f"schema: its events before seq {first} were deleted, so the current code cannot refold it; "
                   f"{WHAT_TO_DO}")


def run(aliases: list[str], *, state: str | None = None, stream: str | None = None, everything: bool = False,
        dry_run: bool = False, batch: int = 100, progress: Callable[[str], None] | None = None,
        now: datetime | None = None) -> Report:
    """Re-snapshot the chosen streams on each of `aliases` (every shard, or one): a stream of a declared state
    with a snapshot, page by page (`batch` streams, one progress line per page); each stream's write is its own
    short transaction. `stream`: that one, on its shard. A shard that cannot be reached is named in the report and
    the others are still done."""
    report = Report()
    declared = states()
    if state is not None and state not in declared:
        raise UnknownTarget(f"no declared aggregate state is named {state!r} (declared: "
                            f"{', '.join(sorted(declared)) or 'none'})")
    if stream is not None:
        st = declared[state] if state is not None else owner(stream)
        if st is None or not stream.startswith(st.prefix) or owner(stream) is not st:
            whose = f"state {state!r}" if state else "any declared state"
            raise UnknownTarget(f"{stream!r} is not a stream of {whose} (a stream id is the state's prefix and the "
                                "aggregate id, e.g. Ticket-42)")
        if st.sensitive:
            report.skipped_states[st.name] = SENSITIVE
            return report
        found = shards.read_each([shards.shard_for(stream)], lambda alias: resnapshot_stream(
            st, stream, alias, everything=everything, dry_run=dry_run, now=now), report.unreachable)
        for outcome in found:
            report.checked += 1
            _add(report, outcome)
        return report
    chosen = [declared[state]] if state is not None else list(declared.values())
    for st in chosen:
        if st.sensitive:
            report.skipped_states[st.name] = SENSITIVE
    chosen = [st for st in chosen if not st.sensitive]
    shards.read_each(aliases, lambda alias: _shard(report, chosen, alias, everything, dry_run, batch, progress, now),
                     report.unreachable)
    return report


def _shard(report: Report, chosen: list[State], alias: str, everything: bool, dry_run: bool, batch: int,
           progress: Callable[[str], None] | None, now: datetime | None) -> None:
    store = retention_store_for(alias)
    for st in chosen:
        after, checked = "", 0
        while True:
            page = store.compact_candidates(st.prefix, after, batch)  # streams with a snapshot, by id
            for stream, _ in page:
                if owner(stream) is not st:  # a longer prefix's stream (`A-b-1` under `A-`)
                    continue
                checked += 1
                report.checked += 1
                _add(report, resnapshot_stream(st, stream, alias, everything=everything, dry_run=dry_run, now=now))
            if page and progress is not None:
                done = sum(1 for o in report.outcomes if o.alias == alias and o.state == st.name
                           and o.action in ("resnapshotted", "would resnapshot"))
                progress(f"{alias}: {st.name}: {checked} stream(s) checked, {done} "
                         f"{'would be re-snapshotted' if dry_run else 're-snapshotted'}")
            if len(page) < batch:
                break
            after = page[-1][0]


def _add(report: Report, outcome: Outcome) -> None:
    if outcome.action == "fits":
        report.fits += 1
    else:
        report.outcomes.append(outcome)
