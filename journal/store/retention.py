"""The retention store: every statement that removes (and restores) settled executions, both backends side
by side (journal/retention.py decides what is due; docs/retention.md explains the locks).

Kept apart from journal/store/base.py on purpose: one interface of its own (`RetentionStore`), registered
as the `retention` store kind, so the journal store's other interfaces never see it.

A batch is one transaction:
  1. take the batch lock: on PostgreSQL `pg_try_advisory_xact_lock` (one remover per shard at a time; a
     second worker's batch returns at once, nothing waits); on SQLite the write lock (BEGIN IMMEDIATE)
     serializes every writer anyway;
  2. lock the candidate headers (`FOR UPDATE OF x SKIP LOCKED` on PostgreSQL): settled, finished before the
     cutoff; then leave out those a live child or a live parent keeps (kept_by_kin). A header some other
     transaction holds (a retry's, a resume's or a
     send's LOCK_HEADER) is skipped, never waited on; one they lock after us waits for our commit and then
     finds no header (UnknownExecution): the execution is either all there or all gone;
  3. (archival) read the rows of the archived ones, write the archive object;
  4. delete the rows of the locked ids, header last, and record the batch (journal_removal).
Appends of other streams take none of these locks: they lock their own fence rows (FOR KEY SHARE) and insert
index entries of their own streams; deleting other streams' rows conflicts with neither.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime

from journal import jsonvalues
from journal.store.base import DatabaseBound

SETTLED = ("completed", "failed", "cancelled")

# -- fill_settled -- (benchmarks: the growth section's settled, ageing journal, through bulk_load)
FILL_EVENTS = ("journal_event", ("stream_id", "seq", "type", "payload", "recorded_at"))
FILL_FENCES = ("journal_fence", ("stream_id", "token", "created_at"))
FILL_SETTLED = ("journal_execution", ("id", "flow", "status", "input", "result", "error", "recoveries", "created_at",
                                      "updated_at", "finished_at"))
# -- table_sizes -- (benchmarks) heap (with TOAST) and index bytes of the tables removal shrinks.
TABLE_SIZES = """
SELECT t, pg_table_size(t::regclass), pg_indexes_size(t::regclass)
FROM unnest(ARRAY['journal_event', 'journal_execution']) t
"""

# -- due -- (status: how many settled headers finished before the cutoff; per policy group)
DUE = """
SELECT count(*) FROM journal_execution x
WHERE x.status IN ('completed', 'failed', 'cancelled') AND x.finished_at < %s {flows}
"""

# -- since -- (lock_candidates) the candidates' lower bound within one run of batches: the newest finished_at the
# run's previous batch locked. Removal goes oldest first, so the head of journal_exec_finished holds the index
# entries of the headers the run already deleted until a VACUUM clears them, and the scan for the next batch
# steps over every one of them (measured, docs/benchmarks.md "per-batch profile": 1 ms a batch at the start of a
# 277,500-execution removal, 27 ms at its end; with this bound 0.5-0.7 ms throughout). `>=`: an execution finished
# at that same instant is still found.
SINCE = "AND x.finished_at >= %s"

# -- kept_by_kin -- of the locked candidates, those a live kin keeps: a child it started (STEP_COMPLETED of
# `$start_child`, whose result is the child's id) or the parent that started it (`$parent` in its
# EXECUTION_STARTED) is live: the parent's wait re-reads the child's outcome, and the child's settle wakes
# its parent. A statement of its own over the batch's ids (index probes of journal_event_stream_seq per id):
# inside the candidates' statement the planner hoisted it into one scan of the whole event table per batch.
KEPT_BY_KIN = """
SELECT c.stream_id FROM journal_event c JOIN journal_execution k ON k.id = {cj}
WHERE c.stream_id IN ({marks}) AND c.type = 'STEP_COMPLETED' AND {cs} = '$start_child'
AND k.status NOT IN ('completed', 'failed', 'cancelled')
UNION
SELECT s.stream_id FROM journal_event s JOIN journal_execution p ON p.id = {pj}
WHERE s.stream_id IN ({marks}) AND s.seq = 0 AND p.status NOT IN ('completed', 'failed', 'cancelled')
"""

# -- kin -- the ids of the candidates' kin (the children they started, the parent that started them) whatever
# shard those live on: a kin on another shard is read there (journal/retention.py), not by KEPT_BY_KIN's join.
# The same index probes per id as KEPT_BY_KIN; no lock.
KIN = """
SELECT c.stream_id, {cj} FROM journal_event c
WHERE c.stream_id IN ({marks}) AND c.type = 'STEP_COMPLETED' AND {cs} = '$start_child'
UNION ALL
SELECT s.stream_id, {pj} FROM journal_event s WHERE s.stream_id IN ({marks}) AND s.seq = 0 AND {pj} IS NOT NULL
"""

# -- delete_rows -- an execution's rows, the header last (while it is there, a retry/resume/send that locked
# nothing yet finds it and waits on our lock). Each statement names the ids: row locks on the removed
# executions' rows only, no table lock.
DELETE_ROWS = (
    ("events", "DELETE FROM journal_event WHERE stream_id IN ({marks})"),
    ("snapshots", "DELETE FROM journal_snapshot WHERE stream_id IN ({marks})"),
    ("fences", "DELETE FROM journal_fence WHERE stream_id IN ({marks})"),
    ("waits", "DELETE FROM journal_wait WHERE execution_id IN ({marks})"),
    ("messages", "DELETE FROM journal_message WHERE execution_id IN ({marks})"),
    ("flow_events", "DELETE FROM journal_flowevent WHERE execution_id IN ({marks})"),
    ("executions", "DELETE FROM journal_execution WHERE id IN ({marks}) AND status IN ('completed', 'failed', "
                   "'cancelled')"),
)

# -- delete_rows_one -- (PostgreSQL) the same seven deletes as one statement: data-modifying CTEs, each naming
# the ids as one array parameter (`= ANY(%s)`: one index probe per id, as IN (...)), the counts in one row.
# One round trip and one plan instead of seven. All seven run on the statement's one snapshot; the headers
# are already locked by lock_candidates (FOR UPDATE), so a retry/resume/send still waits on our lock and then
# finds nothing, whatever order PostgreSQL runs the CTEs in. Row locks on the removed executions' rows only.
DELETE_ROWS_ONE = """
WITH events AS (DELETE FROM journal_event WHERE stream_id = ANY(%s::text[]) RETURNING 1),
snapshots AS (DELETE FROM journal_snapshot WHERE stream_id = ANY(%s::text[]) RETURNING 1),
fences AS (DELETE FROM journal_fence WHERE stream_id = ANY(%s::text[]) RETURNING 1),
waits AS (DELETE FROM journal_wait WHERE execution_id = ANY(%s::text[]) RETURNING 1),
messages AS (DELETE FROM journal_message WHERE execution_id = ANY(%s::text[]) RETURNING 1),
flow_events AS (DELETE FROM journal_flowevent WHERE execution_id = ANY(%s::text[]) RETURNING 1),
executions AS (DELETE FROM journal_execution WHERE id = ANY(%s::text[])
               AND status IN ('completed', 'failed', 'cancelled') RETURNING 1)
SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM snapshots), (SELECT count(*) FROM fences),
       (SELECT count(*) FROM waits), (SELECT count(*) FROM messages), (SELECT count(*) FROM flow_events),
       (SELECT count(*) FROM executions)
"""

# -- record_removal -- the durable record of a batch, in the batch's own transaction (never claims more than
# the transaction removed: it commits with the deletes or not at all).
RECORD_REMOVAL = """
INSERT INTO journal_removal (removed_at, executions, events, messages, flow_events, ids, archive)
VALUES (%s, %s, %s, %s, %s, %s, %s)
"""

# -- recorded_archive -- (restore) whether a committed batch wrote this archive object: an object whose batch
# rolled back or was lost in a crash (a relaxed commit) names executions that batch did not remove; a later
# batch removed them (if it did) with an archive of its own, the one to restore. A plain read, no lock.
RECORDED_ARCHIVE = "SELECT 1 FROM journal_removal WHERE archive = %s"
# -- recorded_archives -- (archive list) of these archive objects, those a committed batch of this shard wrote:
# RECORDED_ARCHIVE for a page of names in one statement. A plain read, no lock.
RECORDED_ARCHIVES = "SELECT archive FROM journal_removal WHERE archive IN ({marks})"
RECORDED_PAGE = 500  # names per statement (SQLite's parameter limit is far above)

# == compaction (journal/compaction.py): an aggregate stream's events before its newest snapshot ==========
# -- compact_candidates -- streams of one state (their prefix) that have a snapshot, with the newest snapshot's
# seq, paged by stream id. A stream with an execution header is never one (flows' logs are not aggregates). No
# lock: a plain read.
COMPACT_CANDIDATES = """
SELECT s.stream_id, max(s.seq) FROM journal_snapshot s
WHERE substr(s.stream_id, 1, %s) = %s AND s.stream_id > %s
AND NOT EXISTS (SELECT 1 FROM journal_execution x WHERE x.id = s.stream_id)
GROUP BY s.stream_id ORDER BY s.stream_id LIMIT %s
"""
# -- first_seq -- the stream's oldest kept event (one forward probe of journal_event_stream_seq): > 0 once the
# stream was compacted. No lock.
FIRST_SEQ = "SELECT seq FROM journal_event WHERE stream_id = %s ORDER BY seq LIMIT 1"
# -- newest_snapshot -- the state a compaction keeps (read again in each batch's transaction). No lock.
NEWEST_SNAPSHOT = "SELECT seq, {state} FROM journal_snapshot WHERE stream_id = %s ORDER BY seq DESC LIMIT 1"
# -- compact_events -- up to `limit` of the stream's oldest events before the snapshot's seq, by primary key.
# Row locks on those old rows only, no table lock: an append never locks an existing event row (its tip is a
# plain MVCC read of the stream's newest index entry and it inserts at seq > tip, above every row deleted
# here), and readers never wait on row locks. The snapshot's own event (seq = before) is kept: the stream's tip
# is read from its events, so the newest event must stay (else the next append would take seq 0 again).
COMPACT_EVENTS = """
DELETE FROM journal_event WHERE id IN (
    SELECT id FROM journal_event WHERE stream_id = %s AND seq < %s ORDER BY seq LIMIT %s)
"""
# -- compact_snapshots -- the stream's snapshots older than the kept one (they stand for deleted events).
COMPACT_SNAPSHOTS = "DELETE FROM journal_snapshot WHERE stream_id = %s AND seq < %s"
# -- record_compaction -- the durable record of one batch, in the batch's transaction (never claims more than
# the transaction deleted).
RECORD_COMPACTION = """
INSERT INTO journal_compaction (compacted_at, state, stream_id, before_seq, events, snapshots)
VALUES (%s, %s, %s, %s, %s, %s)
"""

# == re-snapshot (journal/aggregates/resnapshot.py): a fresh snapshot from the current code ==================
# -- resnapshot -- the state the current code folded from the stream's events 0..seq, claimed at exactly that
# seq: inserted, or put in place of the snapshot an older code took at that seq (save_snapshot's DO NOTHING would
# keep the old one). No lock but the row's own: an append never touches journal_snapshot, and a snapshot at seq N
# stands for events 0..N only, so an append racing it (seq > N) is read after it as every tail is; a loader
# reading the row sees the old state or the new one, never half of either.
RESNAPSHOT = """
INSERT INTO journal_snapshot (stream_id, seq, state, created_at) VALUES (%s, %s, {j}, %s)
ON CONFLICT (stream_id, seq) DO UPDATE SET state = excluded.state, created_at = excluded.created_at
"""

# == index upkeep (journal/reindex.py): B-tree pages that removal emptied, given back by a rebuild ===========
# -- index_sizes -- (PostgreSQL) each valid index of journal_event (the table removal and compaction shrink most),
# its bytes and the table's heap bytes (main fork: what the index entries point into). Catalog reads, no lock.
INDEX_SIZES = """
SELECT t.relname, c.relname, pg_relation_size(c.oid), pg_relation_size(t.oid)
FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_class t ON t.oid = i.indrelid
WHERE t.relname = 'journal_event' AND t.relnamespace = to_regnamespace(current_schema())
AND i.indisvalid ORDER BY c.relname
"""
# -- leftover_rebuilds -- the invalid copies a rebuild that was stopped midway leaves (`<index>_ccnew`, `_ccold`):
# every write still updates them, so they are dropped before anything else.
LEFTOVER_REBUILDS = """
SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_class t ON t.oid = i.indrelid
WHERE t.relname = 'journal_event' AND t.relnamespace = to_regnamespace(current_schema())
AND NOT i.indisvalid AND c.relname ~ '_cc(new|old)[0-9]*$'
"""
DROP_LEFTOVER = "DROP INDEX CONCURRENTLY IF EXISTS {index}"
# -- reindex -- REINDEX INDEX CONCURRENTLY (PostgreSQL 12+): a new copy is built beside the old one and swapped in.
# It takes SHARE UPDATE EXCLUSIVE on the table (appends, reads, removal batches and compaction go on; only DDL,
# VACUUM and another rebuild of the table wait) and waits for the transactions older than each of its phases. It
# cannot run inside a transaction block: the connection is in autocommit, one index per statement.
REINDEX = "REINDEX INDEX CONCURRENTLY {index}"
# -- try_reindex_lock -- a session advisory lock, key 3: one rebuilder per shard (a second one returns at once).
# Session-level, not transaction-level, because the rebuild runs outside any transaction; released right after
# (and by the server if the session ends). Behind a transaction-pooling PgBouncer a session lock does not hold:
# journal/reindex.py refuses to run there (docs/backends.md).
TRY_REINDEX_LOCK = "SELECT pg_try_advisory_lock(1282371437, 3)"  # "Loom", 3: index rebuilds
REINDEX_UNLOCK = "SELECT pg_advisory_unlock(1282371437, 3)"

# -- archive reads -- the rows as stored: payloads as their JSON text (sealed fields stay sealed).
ARCHIVE_HEADERS = """
SELECT id, flow, flow_version, status, {input}, {result}, error, recoveries, created_at, updated_at, finished_at
FROM journal_execution WHERE id IN ({marks})
"""
ARCHIVE_EVENTS = """
SELECT stream_id, seq, type, {payload}, recorded_at FROM journal_event WHERE stream_id IN ({marks})
ORDER BY stream_id, seq
"""
ARCHIVE_FENCES = "SELECT stream_id, token FROM journal_fence WHERE stream_id IN ({marks})"
ARCHIVE_MESSAGES = """
SELECT execution_id, topic, message_id, {payload}, sent_at, consumed_at, consumed_seq FROM journal_message
WHERE execution_id IN ({marks}) ORDER BY id
"""
ARCHIVE_FLOW_EVENTS = """
SELECT execution_id, key, {value}, updated_at FROM journal_flowevent WHERE execution_id IN ({marks})
"""

# -- restore -- an archived execution back, as it was; refused (nothing written) if its id exists again.
RESTORE_EXISTS = """
SELECT 1 FROM journal_execution WHERE id = %s UNION ALL SELECT 1 FROM journal_fence WHERE stream_id = %s
"""
RESTORE_HEADER = """
INSERT INTO journal_execution (id, flow, flow_version, status, input, result, error, recoveries, created_at,
                               updated_at, finished_at)
VALUES (%s, %s, %s, %s, {j}, {j}, %s, %s, %s, %s, %s)
"""
RESTORE_EVENT = "INSERT INTO journal_event (stream_id, seq, type, payload, recorded_at) VALUES (%s, %s, %s, {j}, %s)"
RESTORE_FENCE = "INSERT INTO journal_fence (stream_id, token, created_at) VALUES (%s, %s, %s)"
RESTORE_MESSAGE = """
INSERT INTO journal_message (execution_id, topic, message_id, payload, sent_at, consumed_at, consumed_seq)
VALUES (%s, %s, %s, {j}, %s, %s, %s)
"""
RESTORE_FLOW_EVENT = "INSERT INTO journal_flowevent (execution_id, key, value, updated_at) VALUES (%s, %s, {j}, %s)"


class RetentionStore(DatabaseBound):
    """Removal of settled executions in batches, their archive rows, and restore (one alias)."""

    # Backend spellings, set by each subclass.
    CANDIDATES = ""
    TRY_BATCH_LOCK = ""
    RELAX_COMMIT = ""
    DELETE_ROWS_ONE = ""  # one statement for the seven DELETE_ROWS (PostgreSQL)
    TRY_COMPACT_LOCK = ""
    JSON_TEXT = "{col}"
    JSON_IN = "%s"
    CHILD_ID = CHILD_STEP = PARENT_ID = ""

    def try_batch_lock(self) -> bool:
        """Whether this transaction is the shard's one remover now (no wait either way)."""
        if not self.TRY_BATCH_LOCK:
            return True
        return bool(self._rows(self.TRY_BATCH_LOCK, [])[0][0])

    def due(self, cutoff: datetime, flows: Sequence[str] = (), exclude: Sequence[str] = ()) -> int:
        """Settled headers finished before `cutoff`, of `flows` (or of every flow but `exclude`)."""
        clause, params = self._flows(flows, exclude)
        return self._rows(DUE.format(flows=clause), [cutoff, *params])[0][0]

    def lock_candidates(self, cutoff: datetime, limit: int, flows: Sequence[str] = (),
                        exclude: Sequence[str] = (), since: object = None) -> list[tuple[str, str, object, object]]:
        """Lock (PostgreSQL: FOR UPDATE SKIP LOCKED) up to `limit` removable headers, oldest finished first, none
        finished before `since` (a finished_at as this method returned it; None: from the oldest):
        (id, flow, result, finished_at)."""
        clause, params = self._flows(flows, exclude)
        if since is not None:
            clause, params = f"{clause} {SINCE}", [*params, since]
        sql = self.CANDIDATES.format(flows=clause, result=self.JSON_TEXT.format(col="x.result"))
        rows = self._rows(sql, [cutoff, *params, limit])
        return [(eid, flow, json.loads(result) if isinstance(result, str) else result, finished)
                for eid, flow, result, finished in rows]

    def kept_by_kin(self, ids: Sequence[str]) -> set[str]:
        """Of these (locked) candidates, those a live child or a live parent keeps."""
        if not ids:
            return set()
        marks = ", ".join(["%s"] * len(ids))
        sql = KEPT_BY_KIN.format(marks=marks, cj=self.CHILD_ID, cs=self.CHILD_STEP, pj=self.PARENT_ID)
        return {row[0] for row in self._rows(sql, [*ids, *ids])}

    def kin(self, ids: Sequence[str]) -> list[tuple[str, str]]:
        """(candidate, kin id) for every child a candidate started and the parent that started it."""
        if not ids:
            return []
        marks = ", ".join(["%s"] * len(ids))
        sql = KIN.format(marks=marks, cj=self.CHILD_ID, cs=self.CHILD_STEP, pj=self.PARENT_ID)
        return [(eid, kin) for eid, kin in self._rows(sql, [*ids, *ids]) if isinstance(kin, str) and kin]

    def relax_commit(self) -> None:
        """Let this (removal) transaction's commit return before its WAL is flushed (PostgreSQL; SQLite: nothing).
        Safe for removal only: a crash may lose the last batches, which leaves their executions whole and still
        due (removed again by a later batch); their archive objects name no journal_removal row, and restore
        refuses such an object (journal/retention.py)."""
        if self.RELAX_COMMIT:
            self._count(self.RELAX_COMMIT, [])

    def delete_rows(self, ids: Sequence[str]) -> dict[str, int]:
        """Delete every journal row of these executions (locked by lock_candidates); the counts per kind."""
        if self.DELETE_ROWS_ONE:
            counts = self._rows(self.DELETE_ROWS_ONE, [list(ids)] * len(DELETE_ROWS))[0]
            return {kind: int(n) for (kind, _), n in zip(DELETE_ROWS, counts, strict=True)}
        marks = ", ".join(["%s"] * len(ids))
        return {kind: self._count(sql.format(marks=marks), list(ids)) for kind, sql in DELETE_ROWS}

    def recorded_archive(self, name: str) -> bool:
        """Whether a committed removal batch names this archive object (else its batch rolled back or was lost)."""
        return bool(self._rows(RECORDED_ARCHIVE, [name]))

    def recorded_archives(self, names: Sequence[str]) -> set[str]:
        """Of these archive objects, those a committed removal batch on this alias names."""
        found: set[str] = set()
        names = list(names)
        for start in range(0, len(names), RECORDED_PAGE):
            page = names[start:start + RECORDED_PAGE]
            found |= {row[0] for row in self._rows(RECORDED_ARCHIVES.format(marks=", ".join(["%s"] * len(page))),
                                                   page)}
        return found

    def record_removal(self, at: datetime, counts: dict[str, int], ids: Sequence[str], archive: str) -> None:
        self._count(RECORD_REMOVAL, [at, counts.get("executions", 0), counts.get("events", 0),
                                     counts.get("messages", 0), counts.get("flow_events", 0),
                                     json.dumps(list(ids)), archive])

    def archive_rows(self, ids: Sequence[str]) -> dict[str, list[list]]:
        """The rows of these executions as stored (JSON columns as their text): what an archive holds."""
        marks = ", ".join(["%s"] * len(ids))
        text = self.JSON_TEXT.format
        found = {
            "header": self._rows(ARCHIVE_HEADERS.format(marks=marks, input=text(col="input"),
                                                        result=text(col="result")), list(ids)),
            "event": self._rows(ARCHIVE_EVENTS.format(marks=marks, payload=text(col="payload")), list(ids)),
            "fence": self._rows(ARCHIVE_FENCES.format(marks=marks), list(ids)),
            "message": self._rows(ARCHIVE_MESSAGES.format(marks=marks, payload=text(col="payload")), list(ids)),
            "flow_event": self._rows(ARCHIVE_FLOW_EVENTS.format(marks=marks, value=text(col="value")), list(ids)),
        }
        return {kind: [list(row) for row in rows] for kind, rows in found.items()}

    def exists(self, execution_id: str) -> bool:
        return bool(self._rows(RESTORE_EXISTS, [execution_id, execution_id]))

    def restore_rows(self, rows: dict[str, list[list]], now: datetime) -> None:
        """Insert an archived execution's rows back (the caller's transaction; ids checked free before)."""
        j = self.JSON_IN
        for row in rows.get("header", []):
            self._count(RESTORE_HEADER.format(j=j), row)
        for row in rows.get("event", []):
            self._count(RESTORE_EVENT.format(j=j), row)
        for stream_id, token in rows.get("fence", []):
            self._count(RESTORE_FENCE, [stream_id, token, now])
        for row in rows.get("message", []):
            self._count(RESTORE_MESSAGE.format(j=j), row)
        for row in rows.get("flow_event", []):
            self._count(RESTORE_FLOW_EVENT.format(j=j), row)

    # -- compaction ----------------------------------------------------------------------------------
    def try_compact_lock(self) -> bool:
        """Whether this transaction is the shard's one compactor now (no wait either way)."""
        if not self.TRY_COMPACT_LOCK:
            return True
        return bool(self._rows(self.TRY_COMPACT_LOCK, [])[0][0])

    def compact_candidates(self, prefix: str, after: str, limit: int) -> list[tuple[str, int]]:
        """(stream, newest snapshot seq) of the streams of `prefix` that have a snapshot, after `after`."""
        return [(sid, int(seq)) for sid, seq in self._rows(COMPACT_CANDIDATES, [len(prefix), prefix, after, limit])]

    def first_seq(self, stream_id: str) -> int | None:
        """The seq of the stream's oldest kept event (None: no events)."""
        rows = self._rows(FIRST_SEQ, [stream_id])
        return int(rows[0][0]) if rows else None

    def newest_snapshot(self, stream_id: str) -> tuple[int, object] | None:
        rows = self._rows(NEWEST_SNAPSHOT.format(state=self.JSON_TEXT.format(col="state")), [stream_id])
        if not rows:
            return None
        seq, state = rows[0]
        return int(seq), json.loads(state) if isinstance(state, str) else state

    def compact_events(self, stream_id: str, before: int, limit: int) -> int:
        return self._count(COMPACT_EVENTS, [stream_id, before, limit])

    def compact_snapshots(self, stream_id: str, before: int) -> int:
        return self._count(COMPACT_SNAPSHOTS, [stream_id, before])

    def record_compaction(self, at: datetime, state: str, stream_id: str, before: int, events: int,
                          snapshots: int) -> None:
        self._count(RECORD_COMPACTION, [at, state, stream_id, before, events, snapshots])

    # -- re-snapshot ----------------------------------------------------------------------------------
    def resnapshot(self, stream_id: str, seq: int, state: object, at: datetime) -> None:
        """Write `state` as the stream's snapshot at `seq`, replacing one there (the caller's transaction)."""
        text = jsonvalues.dumps(state, f"snapshot state of {stream_id}")
        self._count(RESNAPSHOT.format(j=self.JSON_IN), [stream_id, seq, text, at])

    # -- index upkeep (PostgreSQL only: SQLite's VACUUM rebuilds a database file whole) ---------------------
    def index_sizes(self) -> list[tuple[str, str, int, int]]:
        """(table, index, index bytes, table heap bytes) of journal_event's indexes."""
        return [(t, i, int(size), int(heap)) for t, i, size, heap in self._rows(INDEX_SIZES, [])]

    def leftover_rebuilds(self) -> list[str]:
        return [row[0] for row in self._rows(LEFTOVER_REBUILDS, [])]

    def _autocommit(self, sql: str) -> None:
        if self.connection.in_atomic_block:  # REINDEX/DROP ... CONCURRENTLY refuse a transaction block
            raise RuntimeError(f"{sql.split(' ')[0]} ... CONCURRENTLY cannot run inside a transaction")
        with self.connection.cursor() as cursor:
            cursor.execute(sql)

    def drop_leftover(self, index: str) -> None:
        self._autocommit(DROP_LEFTOVER.format(index=self.connection.ops.quote_name(index)))

    def reindex(self, index: str) -> None:
        self._autocommit(REINDEX.format(index=self.connection.ops.quote_name(index)))

    def try_reindex_lock(self) -> bool:
        return bool(self._rows(TRY_REINDEX_LOCK, [])[0][0])

    def reindex_unlock(self) -> None:
        self._rows(REINDEX_UNLOCK, [])

    # -- benchmarks only (the growth section's removal cells) ------------------------------------------
    def fill_settled(self, prefix: str, first: int, count: int, per_stream: int, payload: str, days: float,
                     flow: str) -> None:
        """Streams `prefix{n}` of `per_stream` events each, with fence and a completed header of `flow`, their
        recorded_at and finished_at spread evenly over the last `days` days (bulk_load)."""
        from datetime import timedelta

        from django.utils import timezone

        now = timezone.now()
        adapt = self.connection.ops.adapt_datetimefield_value
        when = {n: adapt(now - timedelta(days=days * (n - first) / max(1, count))) for n in range(first, first + count)}
        ids = range(first, first + count)
        self.bulk_load(*FILL_EVENTS, ((f"{prefix}{n}", seq, "BenchFilled", payload, when[n]) for n in ids
                                      for seq in range(per_stream)))
        self.bulk_load(*FILL_FENCES, ((f"{prefix}{n}", 1, when[n]) for n in ids))
        self.bulk_load(*FILL_SETTLED, ((f"{prefix}{n}", flow, "completed", "{}", "null", "", 0, when[n], when[n],
                                        when[n]) for n in ids))
        self.analyze(FILL_EVENTS[0], FILL_FENCES[0], FILL_SETTLED[0])

    def table_sizes(self) -> dict[str, int] | None:
        """Bytes of journal_event and journal_execution, heap and indexes (PostgreSQL; None on SQLite)."""
        if self.connection.vendor != "postgresql":
            return None
        rows = self._rows(TABLE_SIZES, [])
        return {f"{table}_{part}": int(size) for table, heap, index in rows
                for part, size in (("heap_bytes", heap), ("index_bytes", index))}

    def vacuum(self) -> None:
        """VACUUM (not FULL: no exclusive lock) the removed tables so that their space is reused."""
        if self.connection.vendor == "postgresql":
            with self.connection.cursor() as cursor:
                for table in ("journal_event", "journal_execution", "journal_fence"):
                    cursor.execute(f"VACUUM (ANALYZE) {table}")

    @staticmethod
    def _flows(flows: Sequence[str], exclude: Sequence[str]) -> tuple[str, list]:
        if flows:
            return f"AND x.flow IN ({', '.join(['%s'] * len(flows))})", list(flows)
        if exclude:
            return f"AND x.flow NOT IN ({', '.join(['%s'] * len(exclude))})", list(exclude)
        return "", []


class PostgresRetention(RetentionStore):
    # -- try_batch_lock -- a transaction-scoped advisory lock on one fixed key per shard: released by the
    # batch's commit or rollback (a remover that dies holds nothing), and never taken by an append.
    TRY_BATCH_LOCK = "SELECT pg_try_advisory_xact_lock(1282371437, 1)"  # "Loom", 1: retention
    # -- try_compact_lock -- the same kind of lock, key 2: one compactor per shard at a time (a second one's batch
    # returns at once). Appends never take it.
    TRY_COMPACT_LOCK = "SELECT pg_try_advisory_xact_lock(1282371437, 2)"  # "Loom", 2: compaction
    # -- relax_commit -- this transaction only (SET LOCAL): its commit does not wait for the WAL flush, so the
    # batch's commit does not queue behind (or add an fsync to) the appends' own flushes. Never an append's.
    RELAX_COMMIT = "SET LOCAL synchronous_commit = off"
    DELETE_ROWS_ONE = DELETE_ROWS_ONE
    # -- lock_candidates -- FOR UPDATE OF x SKIP LOCKED: the header rows only, and a header another
    # transaction holds (a retry's, resume's or send's LOCK_HEADER) is skipped, never waited on. Rows not
    # held are locked and their WHERE re-checked after any concurrent update (READ COMMITTED), so a header
    # a retry put back to running since the scan is left out.
    CANDIDATES = """
    SELECT x.id, x.flow, {result}, x.finished_at FROM journal_execution x
    WHERE x.status IN ('completed', 'failed', 'cancelled') AND x.finished_at < %s {flows}
    ORDER BY x.finished_at LIMIT %s
    FOR UPDATE OF x SKIP LOCKED
    """
    JSON_TEXT = "{col}::text"
    JSON_IN = "%s::jsonb"
    CHILD_ID = "c.payload->>'result'"
    CHILD_STEP = "c.payload->>'step'"
    PARENT_ID = "s.payload->>'$parent'"


class SqliteRetention(RetentionStore):
    # -- lock_candidates -- no row locks on SQLite: the batch runs under the database's write lock (the
    # caller's BEGIN IMMEDIATE), which every writer, appends included, takes in turn; a batch is kept small
    # so that the wait is one short transaction (docs/retention.md).
    CANDIDATES = """
    SELECT x.id, x.flow, {result}, x.finished_at FROM journal_execution x
    WHERE x.status IN ('completed', 'failed', 'cancelled') AND x.finished_at < %s {flows}
    ORDER BY x.finished_at LIMIT %s
    """
    CHILD_ID = "json_extract(c.payload, '$.result')"
    CHILD_STEP = "json_extract(c.payload, '$.step')"
    PARENT_ID = "json_extract(s.payload, '$.\"$parent\"')"
