"""The invariants every fault scenario ends with, checked in the database after the fact.

    verdict = Verdict()
    verdict.journal(prefix, acks)            # contiguous seqs; acknowledged = stored; no double write
    verdict.projections(prefix, consumers)   # each event applied exactly once (at least once if loose)
    verdict.executions(prefix, ids, steps)   # completed, each step's effect exactly once, no lease left

Three counts come out: `lost` (acknowledged but not stored, a gap, an event a consumer skipped, a
completed step without its effect), `duplicated` (an event or effect applied twice, a double write,
a zombie's write accepted), `stuck` (an execution not completed in time, a queued start never run,
a lease or claim still held, a blocked or lagging subscription, a process left behind). All must be 0.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from django.db import connection
from django.utils import timezone

from benchmarks.faults.fixtures import APPLIED, EFFECTS, TYPE
from journal.flows import events as ev
from journal.models import Event, Execution
from leases.store import store_for as lease_store
from projections.models import Subscription

# -- applied_counts --
# How many times each consumer applied each event of the round's streams.
APPLIED_COUNTS = f"""
SELECT consumer, stream, seq, count(*) FROM {APPLIED} WHERE stream LIKE %s GROUP BY consumer, stream, seq
"""

# -- effect_counts --
# How many times each step's effect of the round's executions happened.
EFFECT_COUNTS = f"""
SELECT execution_id, step, count(*) FROM {EFFECTS} WHERE execution_id LIKE %s GROUP BY execution_id, step
"""

# -- remove_applied / remove_effects --
# Clean-up of a round's rows in the suite's own tables (unless --keep). Lease rows are counted and
# removed by the leases store (count_leases, delete_leases).
REMOVE_APPLIED = f"DELETE FROM {APPLIED} WHERE stream LIKE %s"
REMOVE_EFFECTS = f"DELETE FROM {EFFECTS} WHERE execution_id LIKE %s"


@dataclass
class Verdict:
    """Lost, duplicated and stuck, with the details of where each came from."""

    lost: int = 0
    duplicated: int = 0
    stuck: int = 0
    details: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str, what: str, n: int) -> None:
        self.details[what] = self.details.get(what, 0) + n
        setattr(self, kind, getattr(self, kind) + n)

    def note(self, what: str, n: int) -> None:
        """A figure that is not a failure (re-deliveries of an at-least-once reaction, conflicts)."""
        self.details[what] = self.details.get(what, 0) + n

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.duplicated == 0 and self.stuck == 0

    def problems(self) -> str:
        bad = {k: v for k, v in self.details.items() if v and k.split(":")[0] in ("lost", "duplicated", "stuck")}
        return ", ".join(f"{k}={v}" for k, v in sorted(bad.items())) or "none"

    # -- the journal -----------------------------------------------------------------------------------
    def journal(self, prefix: str, acks: Iterable[tuple[str, int, int]]) -> dict[str, set[int]]:
        """Contiguous seqs from 0 in every stream under `prefix`; every acknowledged (stream, first,
        last) stored; no producer's event (payload w, n) stored twice. Returns the stored seqs."""
        stored: dict[str, set[int]] = {}
        written: Counter = Counter()
        for stream, seq, type_, payload in Event.objects.filter(stream_id__startswith=prefix).values_list(
                "stream_id", "seq", "type", "payload").iterator():
            stored.setdefault(stream, set()).add(seq)
            if type_ == TYPE and isinstance(payload, dict):
                written[(payload.get("w"), payload.get("n"))] += 1
        gaps = sum(1 for seqs in stored.values() if seqs != set(range(len(seqs))))
        self.add("lost", "lost:gaps", gaps)
        missing = sum(1 for stream, first, last in acks for seq in range(first, last + 1)
                      if seq not in stored.get(stream, ()))
        self.add("lost", "lost:acknowledged-not-stored", missing)
        self.add("duplicated", "duplicated:written-twice", sum(n - 1 for n in written.values() if n > 1))
        self.note("events", sum(len(s) for s in stored.values()))
        self.note("acknowledged", sum(last - first + 1 for _, first, last in acks))
        return stored

    # -- projections -----------------------------------------------------------------------------------
    def projections(self, prefix: str, exact: Iterable[str], loose: Iterable[str] = ()) -> None:
        """Every FaultTick under `prefix` applied exactly once by each `exact` consumer, at least once
        by each `loose` one; no subscription blocked, lagging or still claimed."""
        ticks = set(Event.objects.filter(stream_id__startswith=prefix, type=TYPE).values_list("stream_id", "seq"))
        with connection.cursor() as cursor:
            cursor.execute(APPLIED_COUNTS, [prefix + "%"])
            rows = cursor.fetchall()
        counts: dict[str, dict[tuple[str, int], int]] = {}
        for consumer, stream, seq, n in rows:
            counts.setdefault(consumer, {})[(stream, seq)] = n
        for consumer in exact:
            got = counts.get(consumer, {})
            self.add("lost", f"lost:{consumer}", len(ticks - set(got)))
            self.add("duplicated", f"duplicated:{consumer}", sum(n - 1 for n in got.values() if n > 1))
            self.add("duplicated", f"duplicated:{consumer}:phantom", len(set(got) - ticks))
        for consumer in loose:
            got = counts.get(consumer, {})
            self.add("lost", f"lost:{consumer}", len(ticks - set(got)))
            self.note(f"redelivered:{consumer}", sum(n - 1 for n in got.values() if n > 1))
        subs = Subscription.objects.filter(stream__startswith=prefix)
        self.add("stuck", "stuck:blocked-subscriptions", subs.filter(blocked=True).count())
        self.add("stuck", "stuck:lagging-subscriptions", sum(1 for at, tip in subs.values_list("at", "tip")
                                                              if at < tip))
        self.add("stuck", "stuck:claims-held", subs.exclude(leased_by=None).filter(
            leased_until__gt=timezone.now()).count())
        self.note("ticks", len(ticks))

    # -- executions ------------------------------------------------------------------------------------
    def executions(self, prefix: str, ids: Iterable[str], steps: int) -> None:
        """Every execution in `ids` completed; each of its `steps` effects exactly once; no effect of
        a step the journal does not record as completed; no lease left."""
        ids = list(ids)
        status = dict(Execution.objects.filter(id__startswith=prefix).values_list("id", "status"))
        self.add("stuck", "stuck:never-started", sum(1 for i in ids if i not in status))
        self.add("stuck", "stuck:not-completed", sum(1 for i in ids if status.get(i, "completed") != "completed"))
        completed_steps = set()
        for stream, payload in Event.objects.filter(stream_id__startswith=prefix, type=ev.STEP_COMPLETED
                                                    ).values_list("stream_id", "payload").iterator():
            completed_steps.add((stream, payload["step"]))
        with connection.cursor() as cursor:
            cursor.execute(EFFECT_COUNTS, [prefix + "%"])
            effects = {(eid, step): n for eid, step, n in cursor.fetchall()}
        self.add("lost", "lost:completed-step-without-effect", len(completed_steps - set(effects)))
        self.add("duplicated", "duplicated:effects", sum(n - 1 for n in effects.values() if n > 1))
        self.add("duplicated", "duplicated:effect-of-unrecorded-step", len(set(effects) - completed_steps))
        expected = {(i, f"s{k:03d}") for i in ids if status.get(i) == "completed" for k in range(steps)}
        self.add("lost", "lost:step-of-completed-execution", len(expected - completed_steps))
        # A release lost to a crash or a restart of the database leaves an expired row of a settled execution,
        # which the recovery service's pruning deletes within a minute (docs/leases.md): run that pruning now,
        # then any row left (a live lease, or one of an unsettled execution) is a lease left behind.
        self.note("expired-leases-pruned", lease_store().prune_settled_leases())
        self.add("stuck", "stuck:leases-left", lease_store().count_leases(prefix))
        self.note("executions", len(ids))
        self.note("completed", sum(1 for i in ids if status.get(i) == "completed"))


def remove(prefix: str) -> None:
    """Delete a round's rows: its streams, executions, leases, subscriptions and the suite's own rows.
    Maintenance of fault-suite data only (the journal's write path never deletes)."""
    from benchmarks import streams

    streams.remove(prefix)
    Execution.objects.filter(id__startswith=prefix).delete()
    Subscription.objects.filter(stream__startswith=prefix).delete()
    lease_store().delete_leases(prefix)
    with connection.cursor() as cursor:
        cursor.execute(REMOVE_APPLIED, [prefix + "%"])
        cursor.execute(REMOVE_EFFECTS, [prefix + "%"])
