"""What an operator does to queue entries (the admin's queue page, queues/admin.py): cancel one that has
not begun, and set the priority of pending ones. Each decision is taken again when it is carried out (a
confirmation page may be stale: the entry was claimed, begun or finished since), and each row's outcome
is said as it happened, never as it was planned.

Cancelling an entry is cancelling its start: with an execution header (a start accepted as an execution,
status "queued", issue 24) the execution is cancelled through journal.flows.cancel, and the entry too
(its begin is refused); without one (an entry whose execution exists only once a worker begins it) the
entry is cancelled (queues.cancel_pending). An execution that has begun is not the queue's to stop: the
operator is told to cancel the execution instead, on its own page (its Cancel button, journal's admin).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import queues
from journal.flows import cancel
from journal.flows.errors import NotResumable
from journal.models import Execution
from queues.models import CANCELLED, DONE, STARTED
from queues.store import store_for

CANCEL, RUNNING, FINISHED = "cancelled", "running", "finished"  # a cancel's outcomes per row
QUEUED = "queued"  # the header status of an accepted start no worker has begun (journal, issue 24)
PRIORITIES = range(-100, 101)
WHOLE = re.compile(r"[+-]?[0-9]{1,12}")  # the enqueue's bounds (queues/enqueuing.py check_options)


@dataclass(frozen=True, slots=True)
class Plan:
    """What a cancel does (or did) to one entry: `kind` is CANCEL, RUNNING or FINISHED; `text` says it."""

    execution_id: str
    kind: str
    text: str

    @property
    def will(self) -> bool:
        return self.kind == CANCEL


def statuses(execution_ids: Iterable[str], using: str) -> dict[str, str]:
    """The header status of each execution that has one, read on the entries' database (an entry lives
    on its execution's shard)."""

    ids = list(execution_ids)
    return dict(Execution.objects.using(using).filter(pk__in=ids).values_list("pk", "status")) if ids else {}


def plan_cancel(state: str, begun: bool, status: str | None, execution_id: str) -> Plan:
    """What cancelling an entry in `state` (begun: its runner began it) whose execution's header says
    `status` (None: no header) would do."""
    if state in (DONE, CANCELLED):
        return Plan(execution_id, FINISHED, f"nothing: already finished (entry {state}"
                                            + (f", execution {status})" if status else ")"))
    if status in (None, QUEUED) and not (state == STARTED and begun):
        return Plan(execution_id, CANCEL, "will be cancelled: it never starts"
                                          + (" (its queued execution is cancelled too)" if status else ""))
    if status in ("completed", "failed", "cancelled"):
        return Plan(execution_id, FINISHED, f"nothing: already finished (execution {status})")
    return Plan(execution_id, RUNNING, f"nothing: already running (execution {status or 'starting'}) — "
                                       "cancel the execution instead")


def cancel_entry(execution_id: str, using: str, reason: str) -> Plan:
    """Cancel one entry's start now, deciding again from the rows as they are; what was done."""

    entry = queues.entry_of(execution_id, using=using)
    if entry is None:
        return Plan(execution_id, FINISHED, "nothing: the entry is gone (pruned after it finished)")
    status = statuses([execution_id], using).get(execution_id)
    plan = plan_cancel(entry.state, entry.begun_at is not None, status, execution_id)
    if not plan.will:
        return plan
    stopped = queues.cancel_pending(execution_id, using=using)  # the entry first: no worker begins it now
    if status == QUEUED:
        try:
            cancel(execution_id, reason)  # the execution's header and log say cancelled
        except NotResumable as exc:  # it settled meanwhile
            return Plan(execution_id, FINISHED, f"nothing: already finished ({exc})")
        return Plan(execution_id, CANCEL, "cancelled: the entry and its queued execution; it never starts")
    if stopped:
        return Plan(execution_id, CANCEL, "cancelled: it never starts")
    # A worker began it (or it finished) between the read and the cancel: say what it is now.
    entry = queues.entry_of(execution_id, using=using)
    status = statuses([execution_id], using).get(execution_id)
    if entry is None:
        return Plan(execution_id, FINISHED, "nothing: the entry is gone (pruned after it finished)")
    again = plan_cancel(entry.state, True, status, execution_id)
    return again if not again.will else Plan(execution_id, RUNNING, "nothing: a worker began it meanwhile — "
                                                                    "cancel the execution instead")


def check_priority(text: str) -> int:
    """The priority an operator typed, as a whole number -100..100; ValueError naming the problem."""
    value = (text or "").strip()
    if not WHOLE.fullmatch(value):  # ASCII digits only: int() would also take "1_0" and other scripts' digits
        raise ValueError(f"the priority must be a whole number from -100 to 100, got {value[:40]!r}")
    number = int(value)
    if number not in PRIORITIES:
        raise ValueError(f"the priority must be from -100 to 100, got {number}")
    return number


def set_priority(entries_by_shard: dict[str, list[int]], priority: int) -> list[tuple[str, int]]:
    """Set `priority` on the pending entries among these (alias -> entry ids): (alias, id) of each changed,
    shard by shard (each shard's statement is its own; an entry is on one shard)."""

    changed: list[tuple[str, int]] = []
    for alias, ids in entries_by_shard.items():
        changed += [(alias, pk) for pk in store_for(alias).set_priority(ids, priority)]
    return changed

