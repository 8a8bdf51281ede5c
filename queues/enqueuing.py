"""Queue a start: `enqueue(flow, input, queue=...)` checks everything, then, in ONE transaction on the
execution's shard, writes the queued execution (journal.flows.queued.write_queued: its EXECUTION_STARTED,
marked input fields sealed, and its header, status `queued`) and its entry row. Every door of a durable
start comes here: start(queue=...), the HTTP API, cron ticks, the Tasks backend, old-scheme django-q2 tasks.

From that commit on the execution is listed, shown, cancelled and messaged like any other. The entry holds
the input only as the header shows it (marked fields withheld): the runner reads it from the journal, so
`forget` reaches every copy. Whichever worker claims the entry, and however often it is offered again, it
is one run: the runner's begin advances the execution's fence from the token written here.

`enqueue_resume` queues a hand-over's resume (journal.flows.hand_over) on the execution's own queue.
"""

from __future__ import annotations

import json
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import router, transaction
from django.utils import timezone
from ulid import ULID

from journal import jsonvalues, shards
from journal.atomic import atomic
from journal.exceptions import InvalidPayload
from journal.flows import ExecutionExists
from journal.flows import events as ev
from journal.flows.queued import check_seconds, iso, now, started_by, write_queued
from journal.flows.registry import prepare_start
from journal.ids import id_problem
from journal.models import Event
from journal.privacy.codec import withhold
from queues import entry_of
from queues.declarations import ensure_queue
from queues.exceptions import InvalidEnqueue, UnknownQueue
from queues.models import QueueEntry
from queues.store import NewEntry, store_for

MIN_PRIORITY, MAX_PRIORITY = -100, 100  # Django Tasks' range
DEFAULT_QUEUE = "default"  # always declared (LOOM_QUEUE_DEFAULT_CONCURRENCY): every door's queue when none is named


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


def enqueue(flow: Any, input: Any, queue: str = DEFAULT_QUEUE, *, execution_id: str | None = None,
            partition_key: str | None = None, priority: int = 0, dedup_id: str | None = None,
            run_after: datetime | None = None, meta: dict | None = None, timeout: float | None = None,
            using: str | None = None) -> Enqueued:
    """Queue a start of `flow` on `queue`; a loom_worker starts it within the queue's caps. The execution
    exists from the return on (status queued): show, cancel, send and get_event work on it at once.

    Refused before anything is written: UnknownFlow, InvalidInput (journal.flows; also a bad `timeout`),
    UnknownQueue, InvalidEnqueue, ExecutionExists (the id is another start's, or an execution already). A
    second enqueue with the dedup id of a pending or running entry of the queue returns that entry's
    execution; a repeat of the same start of an execution id (same flow, same `started_by` in meta, same
    input) returns it too (created=False). `timeout` (seconds from now): the execution's deadline.

    With LOOM_SHARDS the entry lives on its execution's shard (the dequeue reads the header in the same
    statement), so caps hold per shard; a minted id of an entry with a partition key (else a dedup id) is
    minted on that key's shard, so a partition's cap and a dedup id hold across shards (docs/queues.md)."""

    minted = execution_id is None
    definition, _, stored, execution_id = prepare_start(flow, input, execution_id)
    meta_text = check_options(queue, partition_key, priority, dedup_id, run_after, meta)
    deadline = None if timeout is None else now() + timedelta(seconds=check_seconds(timeout, "timeout"))
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
        return _enqueue(definition, stored, meta, meta_text, deadline, execution_id, queue, partition_key,
                        priority, dedup_id, run_after, using or router.db_for_write(QueueEntry))


def _enqueue(definition, stored: Any, meta: dict | None, meta_text: str, deadline: datetime | None,
             execution_id: str, queue: str, partition_key: str | None, priority: int, dedup_id: str | None,
             run_after: datetime | None, alias: str) -> Enqueued:
    spec = ensure_queue(queue, alias)
    # The entry's copy of the input is the header's: marked fields withheld (the log holds them sealed).
    shown = withhold(ev.EXECUTION_STARTED, {"flow": definition.name, "input": stored})["input"]
    text = jsonvalues.dumps(shown, f"input of flow {definition.name!r}")
    options = {"queue": queue, **{k: v for k, v in (("partition_key", partition_key), ("priority", priority or None),
                                                     ("dedup_id", dedup_id),
                                                     ("run_after", run_after and iso(run_after))) if v is not None}}
    exists = existing = None
    with atomic(alias):
        try:
            write_queued(definition.name, stored, execution_id, meta=meta, deadline=deadline, options=options)
        except ExecutionExists as refused:
            exists = refused
        else:
            existing = store_for(alias).insert_entry(NewEntry(
                queue, execution_id, definition.name, text, meta_text, partition_key, priority, dedup_id, run_after,
                None if spec is None else (spec.concurrency, spec.partition_concurrency, spec.rate_limit,
                                           spec.rate_period)))
            if existing is not None:  # a live entry holds the dedup id (or, an old entry, the id): nothing new
                transaction.set_rollback(True, using=alias)
    if exists is not None:
        if _same_start(definition.name, stored, execution_id, meta):
            return Enqueued(execution_id, False, queue)
        raise exists
    if existing is None:
        return Enqueued(execution_id, True, queue)
    if existing.by_dedup:
        return Enqueued(existing.execution_id, False, queue)
    if existing.flow == definition.name and existing.input == json.loads(text):
        return Enqueued(execution_id, False, queue)  # an entry written before queued executions, started again
    raise ExecutionExists(execution_id, "queued", existing.flow)


def _same_start(flow: str, stored: Any, execution_id: str, meta: dict | None) -> bool:
    """Whether an existing execution is this start again: queued, same flow, same starter (meta's
    `started_by`), same input (as the log holds it: code holds the plaintext anyway. The HTTP API decides
    by flow and starter only, loomapi/views.py, so no caller learns withheld input by guessing)."""

    found = started_by(execution_id)
    who = (meta or {}).get("started_by") if isinstance(meta, dict) else None
    if found is None or found != (flow, who if isinstance(who, str) else ""):
        return False
    first = Event.objects.read(execution_id, limit=1)
    payload = first[0].payload if first and isinstance(first[0].payload, dict) else {}
    return "$queue" in payload and payload.get("input") == stored  # a queued start's, not one started directly


def enqueue_resume(execution_id: str, flow: str, fence: int | None, *, force: bool = False,
                   queue: str | None = None) -> bool:
    """Queue a resume of an existing execution from `fence` (journal.flows.hand_over, retry's handoff) on the
    queue of its entry (else `queue`, else the default queue), so a hand-over obeys that queue's caps and
    runs on any loom_worker's dispatcher. False (nothing written) when its entry is a pending start."""

    alias = shards.shard_for(execution_id) if shards.sharded() else router.db_for_write(_entry_model())
    entry = entry_of(execution_id, alias)
    name = entry.queue_id if entry is not None else (queue or DEFAULT_QUEUE)
    spec = ensure_queue(name, alias)
    caps = None if spec is None else (spec.concurrency, spec.partition_concurrency, spec.rate_limit, spec.rate_period)
    return store_for(alias).upsert_resume(NewEntry(name, execution_id, flow, "", "", caps=caps, resume_fence=fence,
                                                   resume_force=force))


def _entry_model():
    return QueueEntry
