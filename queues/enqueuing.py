"""Queue a start: `enqueue(flow, input, queue=...)` checks everything, then writes one entry row.

The execution id is fixed here (minted when not given), so the entry is idempotent: whichever worker
claims it, and however often it is offered again, it is one execution (a second start of the id is
refused by the journal's sequence-0 bootstrap).
"""

from __future__ import annotations

import json
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import router
from django.utils import timezone
from ulid import ULID

from journal import jsonvalues, shards
from journal.exceptions import InvalidPayload
from journal.ids import id_problem
from queues.exceptions import InvalidEnqueue, UnknownQueue

MIN_PRIORITY, MAX_PRIORITY = -100, 100  # Django Tasks' range


@dataclass(frozen=True, slots=True)
class Enqueued:
    """What an enqueue did: the execution id (the existing one when deduplicated) and whether it
    wrote an entry (False: a live entry with the dedup id, or the same start of that id, was there)."""

    execution_id: str
    created: bool
    queue: str


def _check_key(value: Any, what: str) -> str | None:
    if value is None:
        return None
    problem = id_problem(value) if isinstance(value, str) else f"a {what} is a str"
    if problem is not None:
        raise InvalidEnqueue(f"{what} {value!r}: {problem}")
    return value


def check_options(queue: Any, partition_key: Any, priority: Any, dedup_id: Any, run_after: Any,
                  meta: Any) -> str:
    """Refuse unusable options before anything is written; the meta as JSON text ("" for none)."""
    if not isinstance(queue, str) or not queue:
        raise UnknownQueue(f"a queue is named by a non-empty str, got {queue!r}")
    _check_key(partition_key, "partition_key")
    _check_key(dedup_id, "dedup_id")
    if isinstance(priority, bool) or not isinstance(priority, int) or not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise InvalidEnqueue(f"priority must be a whole number from {MIN_PRIORITY} to {MAX_PRIORITY}, got {priority!r}")
    if run_after is not None and (not isinstance(run_after, datetime) or timezone.is_naive(run_after)):
        raise InvalidEnqueue(f"run_after must be an aware datetime, got {run_after!r}")
    if meta is None:
        return ""
    if not isinstance(meta, dict):
        raise InvalidEnqueue(f"meta is a dict, got {type(meta).__name__}")
    try:
        return jsonvalues.dumps(meta, "meta")
    except InvalidPayload as exc:
        raise InvalidEnqueue(str(exc)) from None


def enqueue(flow: Any, input: Any, queue: str = "default", *, execution_id: str | None = None,
            partition_key: str | None = None, priority: int = 0, dedup_id: str | None = None,
            run_after: datetime | None = None, meta: dict | None = None, using: str | None = None) -> Enqueued:
    """Queue a start of `flow` on `queue`; a loom_worker starts it within the queue's caps.

    Refused before anything is written: UnknownFlow, InvalidInput (journal.flows), UnknownQueue,
    InvalidEnqueue, ExecutionExists (the id is another start's, or an execution already). A second
    enqueue with the dedup id of a pending or running entry of the queue returns that entry's
    execution; the same start of the same execution id returns it too (created=False).

    With LOOM_SHARDS the entry lives on its execution's shard (the dequeue reads the header in the same
    statement), so caps hold per shard; a minted id of an entry with a partition key (else a dedup id) is
    minted on that key's shard, so a partition's cap and a dedup id hold across shards (docs/queues.md)."""
    from journal.flows.runtime import prepare_start
    from queues.models import QueueEntry

    minted = execution_id is None
    definition, _, stored, execution_id = prepare_start(flow, input, execution_id)
    meta_text = check_options(queue, partition_key, priority, dedup_id, run_after, meta)
    text = jsonvalues.dumps(stored, f"input of flow {definition.name!r}")
    if shards.sharded():
        if minted and (partition_key is not None or dedup_id is not None):
            # A partition's entries (its cap) and a dedup id's entries live on one shard: the id is minted there.
            key = partition_key if partition_key is not None else f"{queue}:{dedup_id}"
            execution_id = shards.mint_on(shards.shard_of_key(key), lambda: str(ULID()))
        home = shards.shard_for(execution_id)
        if using is not None and using != home:
            raise InvalidEnqueue(f"using={using!r}: with LOOM_SHARDS an entry lives on its execution's shard "
                                 f"({home!r} for {execution_id!r}); leave `using` out")
        using = home
    with shards.bound(using) if shards.sharded() else nullcontext():
        return _enqueue(definition, stored, text, meta_text, execution_id, queue, partition_key, priority, dedup_id,
                        run_after, using or router.db_for_write(QueueEntry))


def _enqueue(definition, stored: Any, text: str, meta_text: str, execution_id: str, queue: str,
             partition_key: str | None, priority: int, dedup_id: str | None, run_after: datetime | None,
             alias: str) -> Enqueued:
    from journal.flows import ExecutionExists
    from journal.flows.writer import header_status
    from queues.declarations import ensure_queue
    from queues.store import NewEntry, store_for

    spec = ensure_queue(queue, alias)
    header = header_status(execution_id)
    if header is not None:
        raise ExecutionExists(execution_id, header[0], header[1])
    existing = store_for(alias).insert_entry(NewEntry(
        queue, execution_id, definition.name, text, meta_text, partition_key, priority, dedup_id, run_after,
        None if spec is None else (spec.concurrency, spec.partition_concurrency, spec.rate_limit, spec.rate_period)))
    if existing is None:
        return Enqueued(execution_id, True, queue)
    if existing.by_dedup:
        return Enqueued(existing.execution_id, False, queue)
    if existing.flow == definition.name and existing.input == json.loads(text):
        return Enqueued(execution_id, False, queue)  # a repeat of the same start
    raise ExecutionExists(execution_id, "queued", existing.flow)
