"""Retention: settled executions removed after their flow's retention period, archived first if asked.

    LOOM_RETENTION_DAYS = 30                               # every flow (unset: keep forever)
    LOOM_RETENTION_FLOWS = ["audit.export=forever", "orders.checkout=400"]
    LOOM_ARCHIVE_FLOWS = ["orders.checkout"]               # JSON lines to a STORAGES backend before removal

What is removed: a completed, failed or cancelled execution whose `finished_at` is older than its period,
with its events, snapshots, fence, wait row, messages and flow events, and (REMOVE_HOOKS, registered by the
apps above the journal) its lease row, start reservation and queue entries. What never is: a running,
waiting, suspended, queued or stuck execution; a parent while a child it started is live; a child while its
parent is live; a run of a continue_as_new chain while the chain's newest run is live; aggregate streams
(no header). Statements: journal/store/retention.py; locks and races: docs/retention.md.

A removed id is free again: a later start with that id starts a new execution (as after Temporal's retention).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import DatabaseError, connections
from django.utils import timezone

from journal import conf, shards
from journal.atomic import atomic

log = logging.getLogger("loom.retention")

FOREVER = None

# Callables (execution_ids, alias) run in a removal batch's transaction, after the journal rows are gone:
# another app deletes its own rows of those executions there (leases: lease rows and start reservations;
# queues: entries). Registered at the app's ready(), so the journal never imports them.
REMOVE_HOOKS: list = []


def add_remove_hook(hook) -> None:
    """Register `hook(ids, alias)`, run in each removal batch's transaction (an app above the journal deleting
    its own rows of the removed executions: leases, queues), once."""
    if hook not in REMOVE_HOOKS:
        REMOVE_HOOKS.append(hook)


def parse_flow_policies(entries: list) -> dict[str, float | None]:
    """`["flow=days", "other=forever"]` as {flow: days or None}; ValueError names the bad entry."""
    found: dict[str, float | None] = {}
    for entry in entries:
        if not isinstance(entry, str) or "=" not in entry:
            raise ValueError(f"entries are 'flow=days' or 'flow=forever', got {entry!r}")
        name, _, value = entry.rpartition("=")
        name, value = name.strip(), value.strip().lower()
        if not name or name in found:
            raise ValueError(f"{entry!r}: a flow name, each flow once")
        if value == "forever":
            found[name] = FOREVER
            continue
        try:
            days = float(value)
        except ValueError:
            raise ValueError(f"{entry!r}: days must be a number or 'forever'") from None
        if not days >= 0 or days == float("inf"):
            raise ValueError(f"{entry!r}: days must be a finite number >= 0")
        found[name] = days
    return found


@dataclass(frozen=True)
class Group:
    """One retention policy as a query: settled headers finished before `cutoff`, of `flows` (or of every
    flow not in `exclude`)."""

    label: str
    days: float
    cutoff: datetime
    flows: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()


def groups(now: datetime | None = None) -> list[Group]:
    """The policies in force now, one group per flow with its own period and one for every other flow."""
    now = now or timezone.now()
    per_flow = parse_flow_policies(conf.get("LOOM_RETENTION_FLOWS"))
    found = [Group(f"flow {name}", days, now - timedelta(days=days), flows=(name,))
             for name, days in per_flow.items() if days is not FOREVER]
    default = conf.get("LOOM_RETENTION_DAYS")
    if default is not None:
        found.append(Group("default", default, now - timedelta(days=default), exclude=tuple(per_flow)))
    return found


def cutoff_for(flow: str, now: datetime | None = None) -> datetime | None:
    """The instant before which a settled execution of `flow` is removed (its policy: the flow's own, else the
    default), or None if the flow is kept forever. What a schedule's backfill reads (leases/schedule_ops.py):
    a tick older than this may have run and been removed, its id free again."""
    now = now or timezone.now()
    per_flow = parse_flow_policies(conf.get("LOOM_RETENTION_FLOWS"))
    days = per_flow[flow] if flow in per_flow else conf.get("LOOM_RETENTION_DAYS")
    return None if days is FOREVER else now - timedelta(days=days)


def _archived(flow: str) -> bool:
    chosen = conf.get("LOOM_ARCHIVE_FLOWS")
    return "*" in chosen or flow in chosen


def _journal_store(alias: str):
    from journal.store import store_for

    return store_for(alias)


def _store(alias: str):
    from journal.store import retention_store_for

    return retention_store_for(alias)


@dataclass
class Batch:
    """What one removal batch did (what its journal_removal row records)."""

    ids: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    archive: str = ""
    skipped: bool = False  # another remover held the shard's batch lock: nothing done


def remove_batch(alias: str, now: datetime | None = None, limit: int | None = None,
                 cursor: dict[str, Any] | None = None) -> Batch:
    """One transaction on `alias`: lock up to `limit` removable executions, archive those whose flow is
    archived, delete all their rows, run REMOVE_HOOKS, record the batch. A failure (the archive's storage,
    the database) rolls the whole batch back: nothing removed, nothing recorded.

    `cursor` (run()'s, one per run of batches): per policy, the newest finished_at a committed batch of this run
    locked; the next batch looks no further back (store SINCE: what saves it the scan over the index entries of
    the headers the run deleted). An execution older than that which a batch left (kept by a live kin, its
    header locked by a retry) is looked at again by the next run, not by this one."""
    now = now or timezone.now()
    limit = limit or conf.get("LOOM_RETENTION_BATCH")
    relaxed = conf.get("LOOM_RETENTION_RELAXED_COMMIT")  # read (and refused if bad) before any statement
    # Relaxed only when the batch is its own transaction: inside a caller's, SET LOCAL would last until the
    # caller's commit and relax that commit too (the caller's own writes).
    relaxed = relaxed and not connections[alias].in_atomic_block
    store = _store(alias)
    batch = Batch()
    with atomic(alias):
        if relaxed:
            store.relax_commit()
        if not store.try_batch_lock():
            batch.skipped = True
            return batch
        chosen: list[tuple[str, str]] = []
        newest: dict[str, Any] = {}
        for group in groups(now):
            if len(chosen) >= limit:
                break
            found = store.lock_candidates(group.cutoff, limit - len(chosen), group.flows, group.exclude,
                                          since=(cursor or {}).get(group.label))
            if found:
                newest[group.label] = found[-1][3]  # oldest first: the last one is the newest
            kept = store.kept_by_kin([eid for eid, *_ in found])
            kept |= _kept_by_kin_elsewhere(alias, store, [eid for eid, *_ in found if eid not in kept])
            chosen += [(eid, flow) for eid, flow, result, _ in found
                       if eid not in kept and _chain_settled(alias, result)]
        if not chosen:
            return batch
        batch.ids = [eid for eid, _ in chosen]
        archived = [eid for eid, flow in chosen if _archived(flow)]
        if archived:
            batch.archive = write_archive(alias, store.archive_rows(archived), now)
        batch.counts = store.delete_rows(batch.ids)
        for hook in REMOVE_HOOKS:
            hook(batch.ids, alias)
        store.record_removal(now, batch.counts, batch.ids, batch.archive)
    if cursor is not None:  # committed: the next batch of the run starts there (a rolled-back one moves nothing)
        cursor.update(newest)
    log.info("retention removed %d execution(s), %d event(s) on %s%s", len(batch.ids),
             batch.counts.get("events", 0), alias, f" (archive {batch.archive})" if batch.archive else "")
    return batch


def _kept_by_kin_elsewhere(alias: str, store, ids: list[str]) -> set[str]:
    """Of these candidates, those a live kin on ANOTHER shard keeps (KEPT_BY_KIN joins on the batch's shard
    only; a child started with its own execution_id may live on any shard, docs/flows.md). The kin's header is
    read on its shard; a shard that cannot be read keeps the candidate (removing it could strand a live kin)."""
    if not ids or not shards.sharded():
        return set()
    kept: set[str] = set()
    for eid, kin in store.kin(ids):
        if eid in kept:
            continue
        try:
            where = shards.shard_for(kin)
            if where == alias:
                continue  # KEPT_BY_KIN read it
            header = _journal_store(where).execution_status(kin)
        except (DatabaseError, OSError) as exc:
            log.warning("retention keeps %s: its kin %s could not be read on its shard (%s)", eid, kin, exc)
            kept.add(eid)
            continue
        if header is not None and header[0] not in ("completed", "failed", "cancelled"):
            kept.add(eid)
    return kept


def _chain_settled(alias: str, result: Any) -> bool:
    """A run that continued as new is removable only once every later run of its chain is settled (or gone):
    the id a caller knows stands for the whole chain (journal/flows/waits.py chain_current)."""
    seen = 0
    while isinstance(result, dict) and list(result) == ["continued_as"] and seen < 10_000:
        header = _journal_store(alias).execution_status(result["continued_as"])
        if header is None:
            return True
        status, _, result, _ = header
        if status not in ("completed", "failed", "cancelled"):
            return False
        seen += 1
    return True


# The duty cycle's clock and pause (module names so that a test replaces them instead of reading a clock).
_clock = time.monotonic
_sleep = time.sleep


def run(alias: str, now: datetime | None = None, max_batches: int | None = None,
        stop: threading.Event | None = None, cursor: dict[str, Any] | None = None) -> dict[str, int]:
    """Batches on `alias` until nothing is due (or another remover holds the lock, or `stop` is set): the
    totals. After a batch that took t seconds it pauses LOOM_RETENTION_DUTY * t (0: none), so that a long
    removal leaves the appends' commits that share its cores, WAL and disk a share of the time. Each batch
    starts where the run's previous one ended (remove_batch's `cursor`; pass one to go on with another run's)."""
    duty = conf.get("LOOM_RETENTION_DUTY")  # read (and refused if bad) before any batch
    cursor = {} if cursor is None else cursor
    totals = {"batches": 0, "executions": 0, "events": 0, "messages": 0, "flow_events": 0}
    while max_batches is None or totals["batches"] < max_batches:
        if stop is not None and stop.is_set():
            break
        began = _clock()
        batch = remove_batch(alias, now, cursor=cursor)
        if batch.skipped or not batch.ids:
            break
        totals["batches"] += 1
        totals["executions"] += len(batch.ids)
        for kind in ("events", "messages", "flow_events"):
            totals[kind] += batch.counts.get(kind, 0)
        if duty:
            pause = duty * (_clock() - began)
            if stop is not None:
                stop.wait(pause)
            else:
                _sleep(pause)
    return totals


def status(alias: str, now: datetime | None = None, recent: int = 10) -> dict:
    """What is due now per policy (settled headers past their period; a live child or parent may still keep
    some) and the newest removal batches."""
    from journal.models import Removal

    store = _store(alias)
    due = [{"policy": g.label, "days": g.days, "cutoff": g.cutoff.isoformat(),
            "due": store.due(g.cutoff, g.flows, g.exclude)} for g in groups(now)]
    batches = [{"id": r.id, "removed_at": r.removed_at.isoformat(), "executions": r.executions, "events": r.events,
                "messages": r.messages, "flow_events": r.flow_events, "archive": r.archive}
               for r in Removal.objects.using(alias).order_by("-id")[:recent]]
    return {"alias": alias, "due": due, "removed": batches,
            "forever": [name for name, days in parse_flow_policies(conf.get("LOOM_RETENTION_FLOWS")).items()
                        if days is FOREVER]}


# == archives ==============================================================================================
# One object per batch: `<prefix>/<alias>/<stamp>-<uuid>.jsonl`, a line per execution holding its rows as
# stored (payloads as their JSON text: sealed fields stay sealed, so forgetting a subject, which destroys its
# key, makes its data in every archive unreadable too), and `<same>.manifest.json` naming the ids, the counts
# and the object's sha256. The object is written before the batch commits: a batch that then fails (or whose
# relaxed commit a crash loses, LOOM_RETENTION_RELAXED_COMMIT) leaves an object of executions it did not
# remove; a later batch removes them again with an object of its own. Restore refuses an object that no
# committed journal_removal row names, so only the archive of the batch that removed them is restored.


def archive_storage():
    from django.core.files.storage import storages

    chosen = conf.get("LOOM_ARCHIVE_STORAGE")
    if chosen:
        return storages[chosen]
    from journal.privacy import content

    return content.store().storage


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return (value if timezone.is_aware(value) else value.replace(tzinfo=UTC)).isoformat()
    return value


def write_archive(alias: str, rows: dict[str, list[list]], now: datetime) -> str:
    """Write one batch's archive object and its manifest; the object's name."""
    from django.core.files.base import ContentFile

    by_id: dict[str, dict[str, list]] = {}
    for kind, found in rows.items():
        for row in found:
            by_id.setdefault(row[0], {}).setdefault(kind, []).append([_jsonable(v) for v in row])
    lines = "".join(json.dumps({"id": eid, **kinds}, ensure_ascii=False) + "\n" for eid, kinds in by_id.items())
    data = lines.encode("utf-8")
    name = f"{conf.get('LOOM_ARCHIVE_PREFIX')}/{alias}/{now.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:12]}.jsonl"
    storage = archive_storage()
    saved = storage.save(name, ContentFile(data))
    manifest = {"object": saved, "alias": alias, "written_at": now.isoformat(), "ids": list(by_id),
                "executions": len(by_id), "events": len(rows.get("event", [])),
                "sha256": hashlib.sha256(data).hexdigest()}
    storage.save(saved + ".manifest.json", ContentFile(json.dumps(manifest, indent=1).encode("utf-8")))
    return saved


class ArchiveError(Exception):
    """The archive object is missing, damaged (its sha256 differs from its manifest's) or not ours."""


def list_archives() -> list[str]:
    """Every archive object's name (from their manifests), oldest first."""
    storage, prefix = archive_storage(), conf.get("LOOM_ARCHIVE_PREFIX")
    found = []
    try:
        aliases, _ = storage.listdir(prefix)
    except (FileNotFoundError, NotADirectoryError):
        return []
    for alias in aliases:
        _, files = storage.listdir(f"{prefix}/{alias}")
        found += [f"{prefix}/{alias}/{f[:-len('.manifest.json')]}" for f in files if f.endswith(".manifest.json")]
    return sorted(found)


def archive_alias(name: str) -> str:
    """The alias whose batch wrote an archive object, from its name (`<prefix>/<alias>/<file>`, write_archive)."""
    parts = name.rsplit("/", 2)
    return parts[-2] if len(parts) == 3 else ""


def committed_archives(names: list[str], unreachable: dict[str, str] | None = None) -> dict[str, bool | None]:
    """Per archive object: True if a committed removal batch on its alias names it (restore takes it), False if
    none does (its batch rolled back, or a crash lost its relaxed commit: restore refuses it), None if that alias
    is not a database here or could not be read (then named in `unreachable`, journal.shards.read_each; without
    it the error is raised). One statement per alias per page of names."""
    by_alias: dict[str, list[str]] = {}
    for name in names:
        by_alias.setdefault(archive_alias(name), []).append(name)
    found: dict[str, bool | None] = dict.fromkeys(names)
    for alias, group in by_alias.items():
        if alias not in connections.settings:
            continue
        for recorded in shards.read_each([alias], lambda a, group=group: _store(a).recorded_archives(group),
                                         unreachable):
            found.update({name: name in recorded for name in group})
    return found


def read_archive(name: str) -> tuple[dict, list[dict]]:
    """(manifest, one dict per execution) of an archive object, its sha256 checked."""
    storage = archive_storage()
    try:
        with storage.open(name + ".manifest.json") as handle:
            manifest = json.loads(handle.read())
        with storage.open(name) as handle:
            data = handle.read()
    except (FileNotFoundError, OSError) as exc:
        raise ArchiveError(f"no archive {name!r}: {exc}") from None
    if hashlib.sha256(data).hexdigest() != manifest.get("sha256"):
        raise ArchiveError(f"archive {name!r} does not match its manifest's sha256")
    return manifest, [json.loads(line) for line in data.decode("utf-8").splitlines() if line]


def restore(name: str, ids: list[str] | None = None, alias: str | None = None) -> list[str]:
    """Put archived executions back as they were (header, events, fence, messages, flow events), all in one
    transaction; refused whole (ArchiveError, nothing written) if an id exists again. The ids restored."""
    manifest, executions = read_archive(name)
    removed_from = manifest.get("alias")
    if alias and removed_from and alias != removed_from and shards.sharded() and removed_from in shards.shards():
        # Under LOOM_SHARDS an execution's rows live on one shard, the one its batch removed them from (where
        # journal.shards finds its id); put back elsewhere, its id would be found on neither or on two.
        raise ArchiveError(f"archive {name!r} holds executions removed from shard {removed_from}; they are "
                           f"restored there, not on {alias} (leave --database out): nothing restored")
    alias = alias or removed_from or "default"
    chosen = [e for e in executions if ids is None or e["id"] in ids]
    store = _store(alias)
    ops = connections[alias].ops
    recorded_on = manifest.get("alias") if manifest.get("alias") in connections.settings else alias
    if not _store(recorded_on).recorded_archive(manifest.get("object", name)):
        # The object was written by a batch that did not commit (it rolled back, or a crash lost its relaxed
        # commit): that batch removed nothing, so the executions are still here or were removed later by a
        # batch with an archive of its own, the one that holds what was removed (a retried execution's newer
        # rows, say), so restoring this older copy would put back what is not what was removed.
        raise ArchiveError(f"archive {name!r} names no committed removal batch on {recorded_on} (its batch "
                           "rolled back or was lost): nothing restored; restore the archive of the batch that "
                           "removed them (loom retention status lists the batches)")
    with atomic(alias):
        for execution in chosen:
            if store.exists(execution["id"]):
                raise ArchiveError(f"execution {execution['id']!r} exists in {alias}: not restored (nothing was)")
            rows = {kind: [_stored_row(kind, row, ops) for row in execution.get(kind, [])]
                    for kind in ("header", "event", "fence", "message", "flow_event")}
            store.restore_rows(rows, ops.adapt_datetimefield_value(timezone.now()))
    return [e["id"] for e in chosen]


# Which archived columns are times (the rows of store.archive_rows).
_TIMES = {"header": (8, 9, 10), "event": (4,), "message": (4, 5), "flow_event": (3,), "fence": ()}


def _stored_row(kind: str, row: list, ops) -> list:
    out = list(row)
    for i in _TIMES[kind]:
        if out[i] is not None:
            moment = datetime.fromisoformat(out[i])
            out[i] = ops.adapt_datetimefield_value(moment if timezone.is_aware(moment) else moment.replace(tzinfo=UTC))
    return out
