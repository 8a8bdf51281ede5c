"""THE write point of durable runs: every journal write of a run goes through `write()`.

One serial tail per execution: a run appends its own events in order, guarded by its fence token
and the tip it expects, so events of one execution never interleave. `write` is also where the
cross-stream coalescer plugs in (LOOM_COALESCE, journal/coalesce.py): on PostgreSQL every write of
a run goes through it — mid-run appends as the journal's `append` kind, the bootstrap and the
settle as the two kinds registered here (`flows.bootstrap`, `flows.settle`), whose executors write
many executions' events and headers in one statement (journal/flows/sql.py BOOT_MANY,
SETTLE_MANY). On SQLite the bootstrap and settle stay direct (nothing to save there).

Three kinds of write, chosen by the run's state:
- bootstrap (the run holds no token yet): sequence 0.. plus fence token 1 plus the header row,
  in one statement (PostgreSQL) or one transaction (SQLite); StreamExists if the id exists;
- append: the run's events, fenced and at the expected tip;
- settle (a terminal header change given): the append plus the header update, together.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, connection, transaction

from journal import coalesce, conf, jsonvalues
from journal.envelopes import Appended, AppendItem, Envelope
from journal.exceptions import AppendRefused, BatchRefused, StreamExists
from journal.flows import sql
from journal.flows.ownership import Companion, InlineLease
from journal.ids import check_stored_id
from journal.models import Event
from journal.store import store_for
from journal.store.base import Verdict


@dataclass(slots=True)
class Settle:
    """The header's terminal state, written with the settling events."""

    status: str
    result: Any = None
    error: str = ""
    # The ownership's companion and lease owner: the settle statement also deletes the run's lease
    # row (PostgreSQL); `released` is set once it did (the claim then has nothing to release).
    companion: Companion | None = None
    lease_owner: str | None = None
    released: bool = False


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


def _input_json(value: Any) -> str:
    """The header's input: JSON null is 'null' (the column is NOT NULL; a flow without input_model takes null)."""
    return jsonvalues.dumps(value, "execution input")


def _json(value: Any) -> str | None:
    """The header's JSON text, by the same boundary as payloads (a float reads back as a float on jsonb)."""
    return None if value is None else jsonvalues.dumps(value, "execution header value")


def write(run: RunHandle, envelopes: list[Envelope], settle: Settle | None = None) -> int:
    """Write the run's next events; return the new tip. Raises StreamExists (bootstrap of an
    existing id) or an AppendRefused (StaleFence after a takeover); nothing is written then."""
    if run.token is None:
        run.token = _bootstrap(run, envelopes, settle)
        run.tip = len(envelopes) - 1
        return run.tip
    if settle is None:
        item = AppendItem.build(run.execution_id, envelopes, run.token, run.tip)
        appended = coalesce.append_item(item, Event.objects.db)  # coalesced when LOOM_COALESCE is on
    else:
        appended = _settle(run, envelopes, settle)
    run.tip = appended.last_seq
    return run.tip


def _bootstrap(run: RunHandle, envelopes: list[Envelope], settle: Settle | None) -> int:
    store = store_for(Event.objects.db)
    item = AppendItem.build(run.execution_id, envelopes)
    status = settle.status if settle else "running"
    result = _json(settle.result) if settle else None
    error = settle.error if settle else ""
    if store.vendor != "postgresql":
        now = store.now()
        with transaction.atomic(using=store.alias):
            token, _ = store.open_stream(item)
            with store.connection.cursor() as cursor:
                cursor.execute(sql.SQLITE_HEADER_INSERT, [run.execution_id, run.flow, status, _input_json(run.input), result,
                                                          error, now, now, now if settle else None])
        return token
    lease = run.lease if run.companion is not None else None
    boot = _Boot(item, store.encode([item])[0], run.flow, status, _input_json(run.input), result, error, settle is not None,
                 run.companion if lease else None, lease.owner if lease else None, lease.ttl if lease else None)
    if coalesce.enabled():  # merged with other executions' bootstraps (BOOTSTRAP below)
        return coalesce.submit(BOOTSTRAP, run.execution_id, boot, store.alias)
    params = {
        "sid": run.execution_id,
        "ords": list(range(len(envelopes))),
        "types": [env.type for env in item.envelopes],
        "payloads": boot.encoded,
        "channel": conf.get("LOOM_NOTIFY_CHANNEL"),
        "flow": run.flow, "status": status, "input": boot.input, "result": result, "error": error,
        "finished": boot.finished, "lease_owner": boot.lease_owner, "lease_ttl": boot.lease_ttl,
    }
    statement = sql.boot(boot.companion, conf.get("LOOM_NOTIFY"))
    try:
        opened = store.execute_guarded(statement, params)[0][0] > 0
    except IntegrityError:
        opened = False
    if not opened:
        raise _exists(run.execution_id)
    return 1


def _settle(run: RunHandle, envelopes: list[Envelope], settle: Settle):
    store = store_for(Event.objects.db)
    if store.vendor != "postgresql":
        with transaction.atomic(using=store.alias):
            appended = Event.objects.append(run.execution_id, envelopes, fence_token=run.token,
                                            expected_seq=run.tip)
            now = store.now()
            with store.connection.cursor() as cursor:
                cursor.execute(sql.SQLITE_HEADER_SETTLE, [settle.status, _json(settle.result), settle.error, now, now,
                                                          run.execution_id])
        return appended
    item = AppendItem.build(run.execution_id, envelopes, run.token, run.tip)
    encoded = store.encode([item])[0]
    companion = settle.companion if settle.lease_owner else None
    if coalesce.enabled():  # merged with other executions' settles (SETTLE below)
        appended = coalesce.submit(SETTLE, run.execution_id,
                                   _SettleRequest(item, encoded, settle.status, _json(settle.result), settle.error,
                                                  companion, settle.lease_owner if companion else None),
                                   store.alias)
        settle.released = companion is not None
        return appended
    # The journal's guarded append statement plus the header CTE; guard verdicts are read and
    # turned into the journal's exceptions exactly as JournalStore.append_batch does.
    params = store.append_params([item], [encoded])
    params.update(hid=run.execution_id, status=settle.status, result=_json(settle.result), error=settle.error,
                  lease_owner=settle.lease_owner, lease_token=run.token)
    statement = sql.settle(companion, conf.get("LOOM_NOTIFY"))
    try:
        row = store.execute_guarded(statement, params)[0]
    except IntegrityError as exc:
        raise store.sequence_conflict([item], exc) from None
    verdict = Verdict(row[0], row[1], row[2], row[3])
    if not verdict.ok:
        raise store.refusal([item], [verdict])
    settle.released = companion is not None
    return Appended(run.execution_id, verdict.tip + 1, verdict.tip + len(envelopes))


def _exists(execution_id: str) -> StreamExists:
    return StreamExists(f"stream {execution_id} already exists (its sequence 0 is written)", [execution_id])


# -- coalesced kinds (PostgreSQL, LOOM_COALESCE): many executions' bootstraps or settles, one statement --
BOOTSTRAP = "flows.bootstrap"
SETTLE = "flows.settle"


@dataclass(slots=True)
class _Boot:
    """One execution's bootstrap, validated and encoded in the caller's thread."""

    item: AppendItem
    encoded: list[str]
    flow: str
    status: str
    input: str | None
    result: str | None
    error: str
    finished: bool
    companion: Companion | None = None  # an inline lease written with the bootstrap (owner, TTL)
    lease_owner: str | None = None
    lease_ttl: float | None = None


@dataclass(slots=True)
class _SettleRequest:
    """One execution's settling append and header change, encoded in the caller's thread."""

    item: AppendItem
    encoded: list[str]
    status: str
    result: str | None
    error: str
    companion: Companion | None = None  # the settle also deletes this owner's lease row
    lease_owner: str | None = None


def _named(refused: AppendRefused, items: list[AppendItem]) -> dict[str, AppendRefused]:
    """The per-stream errors of a refusal: BatchRefused names them; a single item's is its own."""
    if isinstance(refused, BatchRefused):
        return refused.errors
    return {items[0].stream_id: refused}


def _boot_many(using: str, boots: list[_Boot]) -> list[Any]:
    """BOOT_MANY: the executions that won their fence start (token 1); the others get StreamExists."""
    store = store_for(using)
    items = [boot.item for boot in boots]
    params = store.append_params(items, [boot.encoded for boot in boots])
    params.update(flows=[b.flow for b in boots], statuses=[b.status for b in boots], inputs=[b.input for b in boots],
                  results=[b.result for b in boots], errors=[b.error for b in boots],
                  finished=[b.finished for b in boots])
    companion = next((b.companion for b in boots if b.companion is not None), None)
    if companion is not None:
        params.update(lease_owners=[b.lease_owner for b in boots], lease_ttls=[b.lease_ttl for b in boots])
    keys = [item.stream_id for item in items]
    try:
        rows = store.execute_guarded(sql.boot_many(companion, conf.get("LOOM_NOTIFY")), params)
    except IntegrityError as exc:  # seq 0 exists without a fence (an aggregate): that stream exists
        named = _named(store.sequence_conflict(items, exc), items)
        return coalesce.refusal_outcomes(keys, {sid: _exists(sid) for sid in named})
    won = {row[0] for row in rows}
    return [1 if sid in won else _exists(sid) for sid in keys]


def _settle_many(using: str, settles: list[_SettleRequest]) -> list[Any]:
    """SETTLE_MANY: the journal's all-or-nothing guarded append plus every header; refused streams
    get their own error (StaleFence...), the others RETRY and are written again without them."""
    store = store_for(using)
    items = [s.item for s in settles]
    params = store.append_params(items, [s.encoded for s in settles])
    params.update(hids=[i.stream_id for i in items], hstatuses=[s.status for s in settles],
                  hresults=[s.result for s in settles], herrors=[s.error for s in settles])
    leased = [s for s in settles if s.companion is not None]
    companion = leased[0].companion if leased else None
    if companion is not None:
        params.update(lease_eids=[s.item.stream_id for s in leased], lease_owners=[s.lease_owner for s in leased],
                      lease_tokens=[s.item.fence_token for s in leased])
    keys = [item.stream_id for item in items]
    try:
        rows = store.execute_guarded(sql.settle_many(companion, conf.get("LOOM_NOTIFY")), params)
    except IntegrityError as exc:
        return coalesce.refusal_outcomes(keys, _named(store.sequence_conflict(items, exc), items))
    by_stream = {row[0]: Verdict(row[0], row[1], row[2], row[3]) for row in rows}
    verdicts = [by_stream[sid] for sid in keys]
    if all(v.ok for v in verdicts):
        return [Appended(item.stream_id, v.tip + 1, v.tip + len(item.envelopes))
                for item, v in zip(items, verdicts, strict=True)]
    return coalesce.refusal_outcomes(keys, _named(store.refusal(items, verdicts), items))


coalesce.register_kind(BOOTSTRAP, _boot_many)
coalesce.register_kind(SETTLE, _settle_many)


def header_status(execution_id: str) -> tuple[str, str, Any, str] | None:
    """(status, flow, result, error) of the header row, or None; InvalidStream for an id the database cannot
    hold (journal/ids.py: reads accept ids stored before the alphabet), checked before the query."""
    check_stored_id(execution_id, "execution id")
    with connection.cursor() as cursor:
        cursor.execute(sql.HEADER_STATUS, [execution_id])
        row = cursor.fetchone()
    if row is None:
        return None
    result = json.loads(row[2]) if isinstance(row[2], str) else row[2]
    return row[0], row[1], result, row[3]

