"""The journal on SQLite: the same guards as PostgreSQL, checked under SQLite's write lock.

SQLite has one writer at a time. Every append runs in a transaction that takes the write lock at
BEGIN (transaction_mode IMMEDIATE, set in the database OPTIONS and checked by loom.W001), so the
guard reads and the insert see and change the same state: no other writer can slip in between.
Concurrent writers queue on the lock (up to the connection `timeout`) instead of interleaving.
There is no NOTIFY: readers poll.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime

from django.db import IntegrityError, transaction

from journal import jsonvalues
from journal.envelopes import AppendItem, SnapshotRecord
from journal.store.base import ExecutionBoot, ExecutionSettle, JournalStore, Verdict

# -- append: fences --
# The current token of each fenced stream in the batch (read under the write lock).
FENCES = "SELECT stream_id, token FROM journal_fence WHERE stream_id IN ({marks})"

# -- append: tips --
# The last seq of each stream in the batch; the (stream_id, seq) unique index answers MAX.
TIPS = "SELECT stream_id, MAX(seq) FROM journal_event WHERE stream_id IN ({marks}) GROUP BY stream_id"

# -- append: insert --
# One multi-row INSERT for the whole batch, in (stream_id, seq) order.
INSERT = "INSERT INTO journal_event (stream_id, seq, type, payload, recorded_at) VALUES {rows}"

# -- bench: MINIMAL_APPEND --
# Benchmarks only (the `append` section's `minimal` row): one fenced event in one autocommit
# statement (SQLite takes its write lock for it), at a seq the writer tracks itself; the unique
# (stream_id, seq) index is the sequence guard. Raw sqlite3 placeholders.
MINIMAL_APPEND = """
INSERT INTO journal_event (stream_id, seq, type, payload, recorded_at)
SELECT stream_id, ?, ?, ?, ? FROM journal_fence WHERE stream_id = ? AND token = ?
"""

# -- open_stream --
# The fence row first: its primary key refuses a second opener, and the seq-0 insert after it
# refuses a stream that already has events (an aggregate).
OPEN_FENCE = "INSERT INTO journal_fence (stream_id, token, created_at) VALUES (%s, 1, %s)"

# -- advance_fences --
# THE fence advance, of one stream (Fence.objects.advance, resume; an expected token optional) or of
# many (the leases sweep: takeover and give-up). No row lock: the caller's transaction holds the
# write lock (BEGIN IMMEDIATE), so no fenced append can run between an advance and its commit.
ADVANCE_FENCES = """
UPDATE journal_fence SET token = token + 1
WHERE stream_id IN (SELECT value FROM json_each(%(sids)s)) AND (%(expected)s IS NULL OR token = %(expected)s)
RETURNING stream_id, token
"""

# == executions (flows): the header row written WITH the log ==========================================
# The bootstrap and the settle of a durable run are each one IMMEDIATE transaction of plain
# statements (the fence and events as in open_stream and the guarded append, plus the header row):
# under SQLite's single writer there is no round trip to save, so nothing is merged into one
# statement and no ownership companion rides along (one_statement_executions is False).

# -- header_insert -- (the bootstrap, after the fence and the events: refused with them)
HEADER_INSERT = """
INSERT INTO journal_execution (id, flow, status, input, result, error, recoveries, created_at, updated_at,
                               finished_at)
VALUES (%s, %s, %s, %s, %s, %s, 0, %s, %s, %s)
"""

# -- header_settle -- (the settle, only once the guarded append passed, in its transaction)
HEADER_SETTLE = """
UPDATE journal_execution SET status = %s, result = %s, error = %s, updated_at = %s, finished_at = %s WHERE id = %s
"""

SAVE_SNAPSHOT = "INSERT OR IGNORE INTO journal_snapshot (stream_id, seq, state, created_at) VALUES (%s, %s, %s, %s)"

# SQLite allows 32766 host parameters per statement; 5 per row.
MAX_ROWS_PER_INSERT = 6000

# == for other apps: fences, executions recovery, event reads ==========================================
# (journal/store/base.py has the statements both backends share, and the methods. Lists of ids travel
# as one JSON array through json_each, so a statement's text is the same for any number of ids.)

# -- hook: CURRENT_FENCE_JOIN -- (see postgres.CURRENT_FENCE_JOIN; no row locks: one writer at a time)
CURRENT_FENCE_JOIN = "JOIN journal_fence f ON f.stream_id = {eid} AND f.token = {token}"

# -- hook: STREAM_TIP_SQL -- (see postgres.STREAM_TIP_SQL) the last seq of {stream}, NULL if none.
STREAM_TIP_SQL = "SELECT MAX(j.seq) AS tip FROM journal_event j WHERE j.stream_id = {stream}"

# -- hook: EXECUTION_EXISTS -- (see postgres.EXECUTION_EXISTS) whether execution {eid} has a header.
EXECUTION_EXISTS = "EXISTS (SELECT 1 FROM journal_execution e WHERE e.id = {eid})"

# -- hook: RECOVERY_CANDIDATES -- (see postgres.RECOVERY_CANDIDATES) no SKIP LOCKED: the sweep's
# transaction holds the write lock (BEGIN IMMEDIATE), so two sweepers run one after the other.
RECOVERY_CANDIDATES = """
SELECT e.id, e.recoveries, e.flow FROM journal_execution e
{lease_join}
WHERE e.status = 'running'
  AND (%(any_flow)s OR e.flow IN (SELECT value FROM json_each(%(flows)s)))
  AND ({lapsed})
ORDER BY e.id
LIMIT %(limit)s
"""

# -- mark_recovered --
MARK_RECOVERED = """
UPDATE journal_execution SET recoveries = recoveries + 1, updated_at = %(now)s
WHERE id IN (SELECT value FROM json_each(%(eids)s))
"""

# -- mark_stuck --
MARK_STUCK = """
UPDATE journal_execution SET status = 'stuck', updated_at = %(now)s,
    error = 'recovery gave up after ' || recoveries || ' attempts (LOOM_RECOVERY_MAX_ATTEMPTS)'
WHERE id IN (SELECT value FROM json_each(%(eids)s))
"""

# -- read_after -- one query per distinct (stream, seq) pair (see postgres.READ_AFTER).
READ_AFTER = ("SELECT id, stream_id, seq, type, payload, recorded_at FROM journal_event"
              " WHERE stream_id = %s AND seq > %s ORDER BY seq LIMIT %s")


class SqliteStore(JournalStore):
    vendor = "sqlite"

    def _append(self, items: Sequence[AppendItem], encoded) -> list[Verdict]:
        sids = [item.stream_id for item in items]
        marks = ", ".join(["%s"] * len(sids))
        fenced = [item.stream_id for item in items if item.fence_token is not None]
        # atomic(): BEGIN IMMEDIATE, or a savepoint inside the caller's (already locked) transaction.
        with transaction.atomic(using=self.alias), self.connection.cursor() as cursor:
            tokens: dict[str, int] = {}
            if fenced:
                cursor.execute(FENCES.format(marks=", ".join(["%s"] * len(fenced))), fenced)
                tokens = dict(cursor.fetchall())
            cursor.execute(TIPS.format(marks=marks), sids)
            tips = dict(cursor.fetchall())
            verdicts = [
                Verdict(
                    item.stream_id,
                    tips.get(item.stream_id, -1),
                    item.fence_token is None or tokens.get(item.stream_id) == item.fence_token,
                    item.expected_seq,
                )
                for item in items
            ]
            if not all(v.ok for v in verdicts):
                return verdicts
            now = self.now()
            rows = []
            for item, texts, verdict in sorted(
                zip(items, encoded, verdicts, strict=True), key=lambda t: t[0].stream_id
            ):
                for ord_, (env, text) in enumerate(zip(item.envelopes, texts, strict=True)):
                    rows.append((item.stream_id, verdict.tip + 1 + ord_, env.type, text, now))
            for start in range(0, len(rows), MAX_ROWS_PER_INSERT):
                chunk = rows[start:start + MAX_ROWS_PER_INSERT]
                cursor.execute(
                    INSERT.format(rows=", ".join(["(%s, %s, %s, %s, %s)"] * len(chunk))),
                    [value for row in chunk for value in row],
                )
        return verdicts

    def _open(self, item: AppendItem, encoded) -> bool:
        now = self.now()
        try:
            with transaction.atomic(using=self.alias), self.connection.cursor() as cursor:
                cursor.execute(OPEN_FENCE, [item.stream_id, now])
                cursor.execute(
                    INSERT.format(rows=", ".join(["(%s, %s, %s, %s, %s)"] * len(encoded))),
                    [v for ord_, (env, text) in enumerate(zip(item.envelopes, encoded, strict=True))
                     for v in (item.stream_id, ord_, env.type, text, now)],
                )
        except IntegrityError:
            return False
        return True

    def advance_fence(self, stream_id: str, expected_token: int | None = None) -> int:
        with transaction.atomic(using=self.alias):
            rows = self._advance_fences([stream_id], expected_token)
        if not rows:
            raise self.fence_refusal(stream_id, expected_token)
        return rows[0][1]

    # == executions (flows) ==
    def _bootstrap(self, boot: ExecutionBoot) -> bool:
        """One transaction (BEGIN IMMEDIATE, or a savepoint in the caller's): the fence row first (its
        primary key refuses a second start: IntegrityError, all rolled back), the events, the header."""
        sid, now = boot.item.stream_id, self.now()
        with transaction.atomic(using=self.alias), self.connection.cursor() as cursor:
            cursor.execute(OPEN_FENCE, [sid, now])
            cursor.execute(
                INSERT.format(rows=", ".join(["(%s, %s, %s, %s, %s)"] * len(boot.encoded))),
                [v for ord_, (env, text) in enumerate(zip(boot.item.envelopes, boot.encoded, strict=True))
                 for v in (sid, ord_, env.type, text, now)],
            )
            cursor.execute(HEADER_INSERT, [sid, boot.flow, boot.status, boot.input, boot.result, boot.error, now, now,
                                           now if boot.finished else None])
        return True

    def _bootstrap_many(self, boots: Sequence[ExecutionBoot]) -> set[str]:
        """Each bootstrap in its own savepoint of one transaction: a loser (or an aggregate stream's
        id) writes nothing and the others start all the same."""
        won: set[str] = set()
        with transaction.atomic(using=self.alias):
            for boot in boots:
                try:
                    self._bootstrap(boot)
                except IntegrityError:
                    continue
                won.add(boot.item.stream_id)
        return won

    def _settle(self, settles: Sequence[ExecutionSettle]) -> list[Verdict]:
        """The guarded append and, only if every guard passed, the headers, in one transaction."""
        items = [s.item for s in settles]
        with transaction.atomic(using=self.alias):
            verdicts = self._append(items, [s.encoded for s in settles])
            if all(v.ok for v in verdicts):
                now = self.now()
                with self.connection.cursor() as cursor:
                    for s in settles:
                        cursor.execute(HEADER_SETTLE, [s.status, s.result, s.error, now, now, s.item.stream_id])
        return verdicts

    def lock_stream(self, stream_id: str) -> None:
        """Nothing to run: the caller's transaction began IMMEDIATE, so it already holds the database's
        write lock, which serialises every writer (and so every locker of any stream) until it ends."""

    def save_snapshot(self, snapshot: SnapshotRecord) -> None:
        state = jsonvalues.dumps(snapshot.state, f"snapshot state of {snapshot.stream_id}")
        with self.connection.cursor() as cursor:
            cursor.execute(SAVE_SNAPSHOT, [snapshot.stream_id, snapshot.seq, state, self.now()])

    # == for other apps: fences, executions recovery, event reads ==
    sql = {"mark_recovered": MARK_RECOVERED, "mark_stuck": MARK_STUCK}

    def _id_list(self, ids):
        return json.dumps(list(ids))

    def _advance_fences(self, stream_ids, expected_token):
        with self.connection.cursor() as cursor:
            cursor.execute(ADVANCE_FENCES, {"sids": self._id_list(stream_ids), "expected": expected_token})
            return cursor.fetchall()

    def read_after(self, pairs, batch):
        found: dict[tuple[str, int], list] = {}
        with self.connection.cursor() as cursor:
            for pair in sorted(set(pairs)):
                cursor.execute(READ_AFTER, [*pair, batch])
                found[pair] = [self._event(row) for row in cursor.fetchall()]
        return self.reveal_found(found)

    def _event(self, row: tuple):
        from journal.envelopes import StoredEvent

        event_id, stream_id, seq, type_, payload, recorded_at = row
        if isinstance(recorded_at, str):
            recorded_at = datetime.fromisoformat(recorded_at)
        if recorded_at.tzinfo is None:  # SQLite stores UTC without an offset
            recorded_at = recorded_at.replace(tzinfo=UTC)
        return StoredEvent.from_row((event_id, stream_id, seq, type_, payload, recorded_at))
