"""THE write point of durable runs: every journal write of a run goes through `write()`, its wait row
through `park()`.

One serial tail per execution: a run appends its own events in order, guarded by its fence token
and the tip it expects, so events of one execution never interleave. This module decides WHAT a
run writes WHEN; the journal store writes it (journal/store: `bootstrap_execution`,
`settle_execution`, and their coalesced forms `bootstrap_many`, `settle_many`), with the header row
in the same statement or transaction as the events, and turns refusals into the journal's errors.

Three kinds of write, chosen by the run's state:
- bootstrap (the run holds no token yet): sequence 0.. plus fence token 1 plus the header row;
  StreamExists if the id exists;
- append: the run's events, fenced and at the expected tip;
- settle (a terminal header change given): the append plus the header update, together; for a child
  or a continuing run, in one transaction with what the settle owes others (`Settle.parent`: the
  parent's wait woken; `Settle.onward`: the unconsumed messages carried to the next run).
A run that waits writes its wait row after its events (`park`: the row and status waiting, under its fence).

The cross-stream coalescer (LOOM_COALESCE, on by default, journal/coalesce.py) plugs in here:
mid-run appends go through it as the journal's `append` kind, and the bootstrap and the settle as
the two kinds registered below (`flows.bootstrap`, `flows.settle`). On PostgreSQL each batch is
one statement (`one_statement_executions`); on SQLite one IMMEDIATE transaction for the whole batch
(group commit: one write-lock hand-off and one commit for every waiting run instead of one each).
A run that finds the coalescer idle writes directly, exactly as without it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from journal import coalesce, jsonvalues, shards
from journal.atomic import atomic
from journal.envelopes import AppendItem, Envelope
from journal.exceptions import AppendRefused, BatchRefused
from journal.flows import events as ev
from journal.flows import registry
from journal.flows.context import WaitSpec, now
from journal.flows.errors import ExecutionExists
from journal.flows.ownership import Companion, InlineLease
from journal.ids import check_stored_id
from journal.models import Event
from journal.privacy.codec import withhold
from journal.store import store_for
from journal.store.base import ExecutionBoot, ExecutionSettle, ExecutionStore, WaitRecord

log = logging.getLogger("loom.flows")

WAITING_STATUS = "waiting"


@dataclass(slots=True)
class Settle:
    """The header's terminal state, written with the settling events."""

    status: str
    result: Any = None
    error: str = ""
    # The ownership's companion and lease owner: the settle statement also deletes the run's lease
    # row (a store with one_statement_executions); `released` is set once it did (the claim then has
    # nothing to release).
    companion: Companion | None = None
    lease_owner: str | None = None
    released: bool = False
    # What the settle owes others, written in its transaction (no crash gap): a child's settle wakes its
    # parent's wait; a run that continued as new carries its unconsumed messages to the next run.
    parent: str | None = None
    onward: str | None = None


@dataclass(slots=True)
class RunHandle:
    """What the writer needs of a run: its stream, its token (None before the bootstrap), its tip."""

    execution_id: str
    flow: str
    input: Any
    token: int | None = None
    tip: int = -1
    # A fresh start's inline lease (journal/flows/ownership.py): written by the bootstrap statement.
    companion: Companion | None = None
    lease: InlineLease | None = None
    # The flow version a fresh execution starts on (None: the newest registered here; a fork keeps its
    # original's); the bootstrap stamps it (stamp_version) and sets it here.
    version: int | None = None


def stamp_version(flow: str, envelopes: list[Envelope], version: int | None = None) -> tuple[list[Envelope], int]:
    """THE place every start records its flow version (docs/flows.md "Versions"): `$version` in its
    EXECUTION_STARTED payload (left out for version 1: absent means 1; the first envelope; a Sealed payload
    keeps its type: the field is not sealed) and the number the header's flow_version gets. Returns
    (envelopes, version). A start path that writes EXECUTION_STARTED and the header itself (not through
    write()) must call it too."""
    version = registry.started_version(flow, version)
    first = envelopes[0] if envelopes else None
    if first is None or first.type != ev.EXECUTION_STARTED:
        return envelopes, version
    recorded = first.payload.get("$version")
    if recorded is not None:
        return envelopes, int(recorded)
    if version == 1:  # absent means 1 (as in every log written before versions): nothing to add
        return envelopes, version
    payload = type(first.payload)(first.payload)  # a copy (dict or Sealed)
    payload["$version"] = version
    return [Envelope(first.type, payload), *envelopes[1:]], version


def write(run: RunHandle, envelopes: list[Envelope], settle: Settle | None = None) -> int:
    """Write the run's next events; return the new tip. Raises StreamExists (bootstrap of an
    existing id) or an AppendRefused (StaleFence after a takeover); nothing is written then.

    One pass for every kind: the run's store is the bound shard's (its entry point bound it: start, resume, a
    worker), `_request` makes what is written, and it goes to that shard's coalescer (LOOM_COALESCE) or store.
    A settle that owes others (a parent, the next run) writes it in the same transaction, after the header."""
    store = store_for(Event.objects.db)
    if settle is None or not (settle.parent or settle.onward):
        return _write(run, envelopes, settle, store)
    with atomic(store.alias):
        tip = _write(run, envelopes, settle, store)  # the header settles (locked) first: a send after it
        if settle.onward:  # follows the chain; one before it is carried here
            store.carry_messages(run.execution_id, settle.onward, now())
        if settle.parent:  # a child's settle wakes its parent in the same transaction (no crash gap)
            _wake_parent(store, settle.parent, run.execution_id)
    return tip


def park(run: RunHandle, spec: WaitSpec) -> bool:
    """The run's wait row and status waiting, under its fence (after its pending events: `write`); False if
    the fence moved on (another run took it over: nothing written)."""
    record = WaitRecord(run.execution_id, run.flow, spec.kind, spec.pos, run.token, spec.due_at, spec.topic,
                        spec.child)
    return store_for(Event.objects.db).park(record, WAITING_STATUS) is not False


def _write(run: RunHandle, envelopes: list[Envelope], settle: Settle | None, store: ExecutionStore) -> int:
    kind, item, encoded, request = _request(run, envelopes, settle, store)
    if coalesce.enabled():  # merged with other executions' requests of its kind (adaptive: alone, direct)
        outcome = coalesce.submit(kind, run.execution_id, request, store.alias)
    elif kind == BOOTSTRAP:
        outcome = store.bootstrap_execution(request)
    elif kind == SETTLE:
        outcome = store.settle_execution(request)
    else:
        outcome = store.append_encoded([item], [encoded])[0]
    if kind == BOOTSTRAP:
        run.token, run.tip = outcome, len(item.envelopes) - 1
        return run.tip
    if kind == SETTLE:
        settle.released = request.companion is not None  # the statement deleted the lease row too
    run.tip = outcome.last_seq
    return run.tip


def _request(run: RunHandle, envelopes: list[Envelope], settle: Settle | None,
             store: ExecutionStore) -> tuple[str, AppendItem, list[str], Any]:
    """What the run writes next, built in ONE place for the three kinds: (kind, its events as one AppendItem,
    their encoded (sealed) texts, the kind's request). A run without a token bootstraps (its version stamped,
    the header row made); a settle carries the header's terminal state; anything else is a fenced append."""
    fresh = run.token is None
    if fresh:
        envelopes, run.version = stamp_version(run.flow, envelopes, run.version)
    item = AppendItem.build(run.execution_id, envelopes, run.token, None if fresh else run.tip)
    encoded = store.encode([item])[0]  # validated and sealed in the caller's thread, before anything is queued
    if not fresh and settle is None:
        return coalesce.APPEND, item, encoded, (item, encoded)
    # The header's result, by the same JSON boundary as payloads (a float reads back as a float on jsonb).
    result = None if settle is None or settle.result is None else jsonvalues.dumps(settle.result,
                                                                                     "execution header value")
    if not fresh:
        # A store with one_statement_executions deletes the run's lease row in the settle statement.
        companion = settle.companion if settle.lease_owner and store.one_statement_executions else None
        return SETTLE, item, encoded, ExecutionSettle(item, encoded, settle.status, result, settle.error, companion,
                                                      settle.lease_owner if companion else None)
    if run.companion is not None and not store.one_statement_executions:
        run.companion = run.lease = None  # no statement to ride in: the ownership leases on its own
    lease = run.lease if run.companion is not None else None
    return BOOTSTRAP, item, encoded, ExecutionBoot(
        item, encoded, run.flow, settle.status if settle else "running",
        # JSON null is 'null': the column is NOT NULL. Marked fields are withheld: the log holds them sealed.
        jsonvalues.dumps(withhold(ev.EXECUTION_STARTED, {"flow": run.flow, "input": run.input})["input"],
                         "execution input"),
        result, settle.error if settle else "", settle is not None,
        run.companion if lease else None, lease.owner if lease else None, lease.ttl if lease else None,
        run.version,
    )


def _wake_parent(store: ExecutionStore, parent_id: str, child_id: str) -> None:
    """Make the parent's wait for this child due now, inside the child's settle transaction. A parent on
    another shard (a child id of the caller's own) is woken once the settle committed: nothing is atomic
    across shards; if this process dies in between, the parent's re-check (LOOM_WAIT_RECHECK) sees the
    settled child."""
    here, there = store.alias, shards.shard_for(parent_id)
    if there == here:
        store.wake_wait(parent_id, now(), child=child_id)
        return

    def wake() -> None:
        try:
            store_for(there).wake_wait(parent_id, now(), child=child_id)
        except Exception:  # its re-check finds the child settled
            log.exception("could not wake parent %s of %s on shard %s", parent_id, child_id, there)

    transaction.on_commit(wake, using=here)


def header_status(execution_id: str) -> tuple[str, str, Any, str] | None:
    """(status, flow, result, error) of the header row, or None; InvalidStream for an id the database cannot
    hold (journal/ids.py: reads accept ids stored before the alphabet), checked before the query."""
    check_stored_id(execution_id, "execution id")
    return store_for(shards.shard_for(execution_id)).execution_status(execution_id)


def exists_error(execution_id: str) -> ExecutionExists:
    """The ExecutionExists of a refused bootstrap (StreamExists), naming what holds the id: its header, read on
    the shard that refused it (the bound one: no placement asked again, and the refused id was checked)."""
    header = store_for(Event.objects.db).execution_status(execution_id)
    if header is None:
        return ExecutionExists(execution_id, "unknown (a stream of that id exists without an execution header)")
    status, flow, result, error = header
    return ExecutionExists(execution_id, status, flow, result, error)


# -- coalesced kinds (LOOM_COALESCE): many executions' bootstraps or settles, one statement each ----
BOOTSTRAP = "flows.bootstrap"
SETTLE = "flows.settle"


def _outcomes(keys: Sequence[str], write_many: Callable[[], list[Any]]) -> list[Any]:
    """The coalescer's per-caller outcomes of one store call (as the journal's own `append` kind):
    its results, or for a statement refused as a whole, each named stream its own error and RETRY
    for the others (the coalescer writes them again without the refused)."""
    try:
        return write_many()
    except BatchRefused as exc:
        return coalesce.refusal_outcomes(keys, exc.errors)
    except AppendRefused as exc:  # a batch of one: its own refusal
        return [exc]


def _boot_many(using: str, boots: list[ExecutionBoot]) -> list[Any]:
    """JournalStore.bootstrap_many: the executions that won their fence start (token 1); the others
    get StreamExists. One boot alone is the direct bootstrap (the same statements as uncoalesced)."""
    store = store_for(using)
    if len(boots) == 1:
        return _outcomes([boots[0].item.stream_id], lambda: [store.bootstrap_execution(boots[0])])
    return _outcomes([b.item.stream_id for b in boots], lambda: store.bootstrap_many(boots))


def _settle_many(using: str, settles: list[ExecutionSettle]) -> list[Any]:
    """JournalStore.settle_many: all or nothing; refused streams get their own error (StaleFence...),
    the others RETRY."""
    return _outcomes([s.item.stream_id for s in settles], lambda: store_for(using).settle_many(settles))


coalesce.register_kind(BOOTSTRAP, _boot_many)
coalesce.register_kind(SETTLE, _settle_many)
