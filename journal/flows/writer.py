"""THE write point of durable runs: every journal write of a run goes through `write()`.

One serial tail per execution: a run appends its own events in order, guarded by its fence token
and the tip it expects, so events of one execution never interleave. `write` is also where a
cross-stream coalescer plugs in (LOOM_COALESCE, journal/coalesce.py): mid-run appends are plain
`Event.objects.append` calls of one stream with its guards, exactly what a coalescer merges.

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

from journal import coalesce, conf
from journal.envelopes import Appended, AppendItem, Envelope
from journal.exceptions import StreamExists
from journal.flows import sql
from journal.models import Event
from journal.store import postgres as pg
from journal.store import store_for
from journal.store.base import Verdict


@dataclass(slots=True)
class Settle:
    """The header's terminal state, written with the settling events."""

    status: str
    result: Any = None
    error: str = ""


@dataclass(slots=True)
class RunHandle:
    """What the writer needs of a run: its stream, its token (None before the bootstrap), its tip."""

    execution_id: str
    flow: str
    input: Any
    token: int | None = None
    tip: int = -1


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"), ensure_ascii=False)


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
        now = store._now()
        with transaction.atomic(using=store.alias):
            token, _ = store.open_stream(item)
            with store.connection.cursor() as cursor:
                cursor.execute(sql.SQLITE_HEADER_INSERT, [run.execution_id, run.flow, status, _json(run.input), result,
                                                          error, now, now, now if settle else None])
        return token
    limit = conf.get("LOOM_MAX_PAYLOAD_BYTES")
    params = {
        "sid": run.execution_id,
        "ords": list(range(len(envelopes))),
        "types": [env.type for env in item.envelopes],
        "payloads": [env.encode(limit) for env in item.envelopes],
        "channel": conf.get("LOOM_NOTIFY_CHANNEL"),
        "flow": run.flow, "status": status, "input": _json(run.input), "result": result, "error": error,
        "finished": settle is not None,
    }
    statement = sql.BOOT_NOTIFY if conf.get("LOOM_NOTIFY") else sql.BOOT_SILENT
    try:
        with store._guarded(), store.connection.cursor() as cursor:
            pg._execute_prepared(store.connection, cursor, statement, params)
            opened = cursor.fetchone()[0] > 0
    except IntegrityError:
        opened = False
    if not opened:
        raise StreamExists(f"stream {run.execution_id} already exists (its sequence 0 is written)",
                           [run.execution_id])
    return 1


def _settle(run: RunHandle, envelopes: list[Envelope], settle: Settle):
    store = store_for(Event.objects.db)
    if store.vendor != "postgresql":
        with transaction.atomic(using=store.alias):
            appended = Event.objects.append(run.execution_id, envelopes, fence_token=run.token,
                                            expected_seq=run.tip)
            now = store._now()
            with store.connection.cursor() as cursor:
                cursor.execute(sql.SQLITE_HEADER_SETTLE, [settle.status, _json(settle.result), settle.error, now, now,
                                                          run.execution_id])
        return appended
    # The journal's guarded append statement plus the header CTE; guard verdicts are read and
    # turned into the journal's exceptions exactly as JournalStore.append_batch does.
    item = AppendItem.build(run.execution_id, envelopes, run.token, run.tip)
    limit = conf.get("LOOM_MAX_PAYLOAD_BYTES")
    encoded = [[env.encode(limit) for env in item.envelopes]]
    params = store.append_params([item], encoded)
    params.update(hid=run.execution_id, status=settle.status, result=_json(settle.result), error=settle.error)
    statement = sql.SETTLE_NOTIFY if conf.get("LOOM_NOTIFY") else sql.SETTLE_SILENT
    try:
        with store._guarded(), store.connection.cursor() as cursor:
            pg._execute_prepared(store.connection, cursor, statement, params)
            row = cursor.fetchone()
    except IntegrityError as exc:
        raise store._sequence_conflict([item], exc) from None
    verdict = Verdict(row[0], row[1], row[2], row[3])
    if not verdict.ok:
        raise store._refusal([item], [verdict])
    return Appended(run.execution_id, verdict.tip + 1, verdict.tip + len(envelopes))


def header_status(execution_id: str) -> tuple[str, str, Any, str] | None:
    """(status, flow, result, error) of the header row, or None; read on error paths only."""
    with connection.cursor() as cursor:
        cursor.execute(sql.HEADER_STATUS, [execution_id])
        row = cursor.fetchone()
    if row is None:
        return None
    result = json.loads(row[2]) if isinstance(row[2], str) else row[2]
    return row[0], row[1], result, row[3]

