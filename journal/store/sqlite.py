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

from django.db import IntegrityError
from django.utils import timezone

from journal import jsonvalues
from journal.atomic import atomic
from journal.envelopes import AppendItem, SnapshotRecord
from journal.store import sqlite_lean
from journal.store.base import (
    SETTLED_STATUSES,
    ClaimedWait,
    ExecutionBoot,
    ExecutionSettle,
    JournalStore,
    Verdict,
    flow_keys,
)

# -- append: fences --
# The current token of each fenced stream in the batch (read under the write lock).
FENCES = "SELECT stream_id, token FROM journal_fence WHERE stream_id IN ({marks})"

# -- append: tips --
# The last seq of each stream in the batch (-1: no event yet), one correlated MAX per stream: the
# (stream_id, seq) unique index answers each with one seek. (`WHERE stream_id IN (...) GROUP BY
# stream_id` read every row of every stream in the batch: 3.1 ms for a 20,000-event stream, issue 33.)
TIPS = """
SELECT s.value, COALESCE((SELECT MAX(e.seq) FROM journal_event e WHERE e.stream_id = s.value), -1)
FROM json_each(json_array({marks})) s
"""

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
INSERT INTO journal_execution (id, flow, flow_version, status, input, result, error, recoveries, created_at,
                               updated_at, finished_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, 0, %s, %s, %s)
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

# -- hook: RECOVERY_CANDIDATES -- (see postgres.RECOVERY_CANDIDATES: the same two arms; %(orphan)s is
# the cutoff stamp, %(since)s the window's lower stamp, '' for the full orphan pass: the empty string
# sorts before every stamp) no SKIP LOCKED: the sweep's transaction holds the write lock (BEGIN IMMEDIATE), so
# two sweepers run one after the other. `o.status = 'running'` is spelled as journal_exec_running_upd's
# predicate, or SQLite would not use the partial index. CROSS JOIN: SQLite keeps the arms as the outer
# loop and reads each header by primary key (it could otherwise walk every running header in id order
# to skip the sort).
RECOVERY_CANDIDATES = """
SELECT e.id, e.recoveries, e.flow
FROM (
    SELECT o.id AS id FROM journal_execution o
    WHERE o.status = 'running' AND o.updated_at < %(orphan)s AND o.updated_at >= %(since)s AND {unleased}
    UNION ALL
    {expired}
) c
CROSS JOIN journal_execution e
WHERE e.id = c.id
  AND e.status = 'running'
  -- %(flows)s: a JSON array of flow names (any version) or [name, version] pairs (version 0: any), as
  -- postgres.RECOVERY_CANDIDATES.
  AND (%(any_flow)s OR EXISTS (
      SELECT 1 FROM json_each(%(flows)s)
      WHERE CASE json_each.type
                WHEN 'array' THEN json_extract(json_each.value, '$[0]') = e.flow
                                  AND json_extract(json_each.value, '$[1]') IN (0, e.flow_version)
                ELSE json_each.value = e.flow END))
ORDER BY e.id
LIMIT %(limit)s
"""

# -- mark_recovered --
MARK_RECOVERED = """
UPDATE journal_execution SET recoveries = recoveries + 1, updated_at = %(now)s
WHERE id IN (SELECT value FROM json_each(%(eids)s))
"""

# -- count_recovery -- (see postgres.py) only while the fence is the taking run's.
COUNT_RECOVERY = """
UPDATE journal_execution SET recoveries = recoveries + 1, updated_at = %(now)s
WHERE id = %(eid)s AND status = 'running'
  AND EXISTS (SELECT 1 FROM journal_fence f WHERE f.stream_id = %(eid)s AND f.token = %(token)s)
"""

# -- mark_stuck --
MARK_STUCK = """
UPDATE journal_execution SET status = 'stuck', updated_at = %(now)s,
    error = 'recovery gave up after ' || recoveries || ' attempts (LOOM_RECOVERY_MAX_ATTEMPTS)'
WHERE id IN (SELECT value FROM json_each(%(eids)s))
"""

# -- mark_stuck: wake_stuck_parents -- the child waits on them due now.
WAKE_STUCK_PARENTS = """
UPDATE journal_wait SET due_at = %(now)s
WHERE kind = 'child' AND child IN (SELECT value FROM json_each(%(eids)s)) AND (due_at IS NULL OR due_at > %(now)s)
"""

# -- read_after -- one query per distinct (stream, seq) pair (see postgres.READ_AFTER).
READ_AFTER = ("SELECT id, stream_id, seq, type, payload, recorded_at FROM journal_event"
              " WHERE stream_id = %s AND seq > %s ORDER BY seq LIMIT %s")


# == waits (flows that wait) ===========================================================================
# Every statement below runs in a transaction that holds SQLite's write lock (BEGIN IMMEDIATE): park,
# send, wake and claim of one database run one after the other, so a message that lands while an
# execution parks is seen by the park or wakes the row it committed. No SKIP LOCKED: two claimers
# take turns on the lock, and the second finds the first's rows deleted. Times are stored as Django
# stores them (UTC text), so comparisons are text comparisons of one format.

# -- lock_execution -- nothing to lock under the write lock: the status only.
HEADER_STATUS = "SELECT status FROM journal_execution WHERE id = %s"

# -- park --
PARK_FENCED = "SELECT 1 FROM journal_fence WHERE stream_id = %s AND token = %s"
PARK_MESSAGE_READY = """
SELECT 1 FROM journal_message WHERE execution_id = %s AND topic = %s AND consumed_at IS NULL LIMIT 1
"""
PARK_CHILD_READY = """
SELECT 1 FROM journal_execution WHERE id = %s AND status IN ('completed', 'failed', 'cancelled', 'stuck')
"""
PARK_UPSERT = """
INSERT INTO journal_wait (execution_id, flow, kind, pos, token, due_at, topic, child, created_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (execution_id) DO UPDATE SET flow = excluded.flow, kind = excluded.kind, pos = excluded.pos,
    token = excluded.token, due_at = excluded.due_at, topic = excluded.topic, child = excluded.child,
    created_at = excluded.created_at
"""
PARK_HEADER = "UPDATE journal_execution SET status = %s, updated_at = %s WHERE id = %s"

# -- claim_due_waits -- the due rows in due order (any flow: maintenance and tests, a sort of all timer
# rows), then
# each deleted, its fence advanced only from its parked token, its header running.
CLAIM_DUE_ANY = """
SELECT execution_id, token, flow, kind, pos, due_at FROM journal_wait
WHERE due_at IS NOT NULL AND due_at <= %(now)s
ORDER BY due_at LIMIT %(limit)s
"""
# ... of one registered flow (what a worker runs: once per flow, the earliest `limit` of all kept): a
# range scan of the (flow, due_at) index journal_wait_flow_due, so due waits of other flows are never read.
# Of one version (0: any) too: only executions that started on a version this worker has.
CLAIM_DUE = """
SELECT w.execution_id, w.token, w.flow, w.kind, w.pos, w.due_at FROM journal_wait w
WHERE w.flow = %(flow)s AND w.due_at IS NOT NULL AND w.due_at <= %(now)s
  AND (%(version)s = 0 OR EXISTS (SELECT 1 FROM journal_execution e
                                  WHERE e.id = w.execution_id AND e.flow_version = %(version)s))
ORDER BY w.due_at LIMIT %(limit)s
"""
CLAIM_DELETE = "DELETE FROM journal_wait WHERE execution_id IN (SELECT value FROM json_each(%s))"
CLAIM_FENCE = "UPDATE journal_fence SET token = token + 1 WHERE stream_id = %s AND token = %s RETURNING token"
CLAIM_HEADER = "UPDATE journal_execution SET status = 'running', updated_at = %s WHERE id = %s"

# -- next_wait_due --
NEXT_DUE = "SELECT due_at FROM journal_wait WHERE due_at IS NOT NULL ORDER BY due_at LIMIT 1"
NEXT_DUE_OF = """
SELECT w.due_at FROM journal_wait w
WHERE w.flow = %(flow)s AND w.due_at IS NOT NULL
  AND (%(version)s = 0 OR EXISTS (SELECT 1 FROM journal_execution e
                                  WHERE e.id = w.execution_id AND e.flow_version = %(version)s))
ORDER BY w.due_at LIMIT 1
"""

# -- carry_messages -- (in the continuing run's settle transaction: under the write lock) the
# unconsumed messages move to the next run, ids and message_ids kept (one the next run has already is
# not moved twice); the topics moved, to wake the next run's recv.
CARRY_MESSAGES = """
UPDATE journal_message SET execution_id = %(to)s
WHERE execution_id = %(from)s AND consumed_at IS NULL
  AND NOT EXISTS (SELECT 1 FROM journal_message n WHERE n.execution_id = %(to)s
                  AND n.message_id = journal_message.message_id)
RETURNING topic
"""
# ... and the flow events are copied (the next run's own, if it set one already, win).
CARRY_FLOW_EVENTS = """
INSERT INTO journal_flowevent (execution_id, key, value, updated_at)
SELECT %(to)s, key, value, updated_at FROM journal_flowevent WHERE execution_id = %(from)s
ON CONFLICT (execution_id, key) DO NOTHING
"""

# -- wake_wait --
WAKE = """
UPDATE journal_wait SET due_at = %(now)s
WHERE execution_id = %(eid)s AND (due_at IS NULL OR due_at > %(now)s)
  AND (%(topic)s IS NULL OR (kind = 'recv' AND topic = %(topic)s))
  AND (%(child)s IS NULL OR (kind = 'child' AND child = %(child)s))
"""

# -- drop_wait / wait_of --
DROP_WAIT = "DELETE FROM journal_wait WHERE execution_id = %s"
WAIT_OF = "SELECT kind, pos, token, due_at, topic, child, flow FROM journal_wait WHERE execution_id = %s"

# -- set_execution_status -- only at the current fence.
SET_STATUS = """
UPDATE journal_execution SET status = %s, updated_at = %s
WHERE id = %s AND EXISTS (SELECT 1 FROM journal_fence f WHERE f.stream_id = %s AND f.token = %s)
"""

# -- send_message -- idempotent by (execution_id, message_id).
SEND = """
INSERT INTO journal_message (execution_id, topic, message_id, payload, sent_at) VALUES (%s, %s, %s, %s, %s)
ON CONFLICT (execution_id, message_id) DO NOTHING
"""

# -- pending_message / consume_message / messages_of --
PENDING_MESSAGE = """
SELECT id, message_id, payload FROM journal_message
WHERE execution_id = %s AND topic = %s AND consumed_at IS NULL ORDER BY id LIMIT 1
"""
CONSUME = "UPDATE journal_message SET consumed_at = %s, consumed_seq = %s WHERE id = %s AND consumed_at IS NULL"
MESSAGES_OF = """
SELECT message_id, topic, payload, sent_at, consumed_at FROM journal_message
WHERE execution_id = %s ORDER BY id DESC LIMIT %s
"""

# -- put_flow_event / flow_event --
PUT_FLOW_EVENT = """
INSERT INTO journal_flowevent (execution_id, key, value, updated_at) VALUES (%s, %s, %s, %s)
ON CONFLICT (execution_id, key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at
"""
FLOW_EVENT = "SELECT value FROM journal_flowevent WHERE execution_id = %s AND key = %s"


class SqliteStore(JournalStore):
    vendor = "sqlite"

    def _append(self, items: Sequence[AppendItem], encoded) -> list[Verdict]:
        connection = self.connection
        if len(items) == 1 and len(items[0].envelopes) == 1 and sqlite_lean.unobserved(connection):
            # One event, no enclosing transaction: one guarded statement if the caller is in autocommit.
            verdict = sqlite_lean.lean_append(connection, items[0], encoded[0][0])
            if verdict is not None:
                return [verdict]
            # Refused at that moment (or autocommit is off): the transaction below reads the guards again
            # under the write lock (and writes if another writer's commit made them pass) and gives the verdicts.
        return self._append_locked(items, encoded)

    def now(self) -> str:
        """The current time as Django stores it in a datetime column (sqlite_lean.stamp: the same text)."""
        return sqlite_lean.stamp(self.connection)

    def _append_locked(self, items: Sequence[AppendItem], encoded) -> list[Verdict]:
        """The guarded append in one IMMEDIATE transaction (or a savepoint of the caller's)."""
        sids = [item.stream_id for item in items]
        marks = ", ".join(["%s"] * len(sids))
        fenced = [item.stream_id for item in items if item.fence_token is not None]
        # atomic(): BEGIN IMMEDIATE, or a savepoint inside the caller's (already locked) transaction.
        with atomic(self.alias), self.connection.cursor() as cursor:
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
            with atomic(self.alias), self.connection.cursor() as cursor:
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
        with atomic(self.alias):
            rows = self._advance_fences([stream_id], expected_token)
        if not rows:
            raise self.fence_refusal(stream_id, expected_token)
        return rows[0][1]

    # == executions (flows) ==
    def _bootstrap(self, boot: ExecutionBoot) -> bool:
        """One transaction (BEGIN IMMEDIATE, or a savepoint in the caller's): the fence row first (its
        primary key refuses a second start: IntegrityError, all rolled back), the events, the header."""
        sid, now = boot.item.stream_id, self.now()
        with atomic(self.alias), self.connection.cursor() as cursor:
            cursor.execute(OPEN_FENCE, [sid, now])
            cursor.execute(
                INSERT.format(rows=", ".join(["(%s, %s, %s, %s, %s)"] * len(boot.encoded))),
                [v for ord_, (env, text) in enumerate(zip(boot.item.envelopes, boot.encoded, strict=True))
                 for v in (sid, ord_, env.type, text, now)],
            )
            cursor.execute(HEADER_INSERT, [sid, boot.flow, boot.version, boot.status, boot.input, boot.result,
                                           boot.error, now, now, now if boot.finished else None])
        return True

    def _bootstrap_many(self, boots: Sequence[ExecutionBoot]) -> set[str]:
        """Each bootstrap in its own savepoint of one transaction: a loser (or an aggregate stream's
        id) writes nothing and the others start all the same."""
        won: set[str] = set()
        with atomic(self.alias):
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
        with atomic(self.alias):
            verdicts = self._append(items, [s.encoded for s in settles])
            if all(v.ok for v in verdicts):
                now = self.now()
                with self.connection.cursor() as cursor:
                    for s in settles:
                        cursor.execute(HEADER_SETTLE, [s.status, s.result, s.error, now, now, s.item.stream_id])
        return verdicts

    # == waits ==
    def _time(self, value):
        return None if value is None else self.connection.ops.adapt_datetimefield_value(value)

    @staticmethod
    def _read_time(value):
        if value is None or isinstance(value, datetime):
            return value if value is None or value.tzinfo else value.replace(tzinfo=UTC)
        parsed = datetime.fromisoformat(value)
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)

    def lock_execution(self, execution_id):
        """The caller's transaction holds the write lock already (BEGIN IMMEDIATE): the status only."""
        with self.connection.cursor() as cursor:
            cursor.execute(HEADER_STATUS, [execution_id])
            row = cursor.fetchone()
        return None if row is None else row[0]

    def park(self, wait, status):
        now = timezone.now()
        with atomic(self.alias), self.connection.cursor() as cursor:
            cursor.execute(PARK_FENCED, [wait.execution_id, wait.token])
            if cursor.fetchone() is None:
                return False
            due = wait.due_at
            if wait.kind == "recv":
                cursor.execute(PARK_MESSAGE_READY, [wait.execution_id, wait.topic])
                due = now if cursor.fetchone() is not None else due
            elif wait.kind == "child":
                cursor.execute(PARK_CHILD_READY, [wait.child])
                due = now if cursor.fetchone() is not None else due
            cursor.execute(PARK_UPSERT, [wait.execution_id, wait.flow, wait.kind, wait.pos, wait.token,
                                         self._time(due), wait.topic, wait.child, self._time(now)])
            cursor.execute(PARK_HEADER, [status, self._time(now), wait.execution_id])
        return due

    def claim_due_waits(self, now, limit, flows):
        claimed = []
        with atomic(self.alias), self.connection.cursor() as cursor:
            if flows is None:
                cursor.execute(CLAIM_DUE_ANY, {"now": self._time(now), "limit": limit})
                taken = cursor.fetchall()
            else:
                taken = []
                for flow, version in zip(*flow_keys(flows), strict=True):
                    cursor.execute(CLAIM_DUE, {"now": self._time(now), "limit": limit, "flow": flow,
                                               "version": version})
                    taken.extend(cursor.fetchall())
                taken = sorted(taken, key=lambda r: r[5])[:limit]
            if not taken:
                return []
            taken = [r[:5] for r in taken]
            cursor.execute(CLAIM_DELETE, [json.dumps([r[0] for r in taken])])
            stamp = self._time(timezone.now())
            for eid, token, flow, kind, pos in sorted(taken):
                cursor.execute(CLAIM_FENCE, [eid, token])
                row = cursor.fetchone()
                if row is None:
                    continue  # taken over since it parked: the stale row is gone, nothing wakes
                cursor.execute(CLAIM_HEADER, [stamp, eid])
                claimed.append(ClaimedWait(eid, row[0], flow, kind, pos))
        return claimed

    def next_wait_due(self, flows=None):
        with self.connection.cursor() as cursor:
            if flows is None:
                cursor.execute(NEXT_DUE)
                rows = cursor.fetchall()
            else:
                rows = []
                for flow, version in zip(*flow_keys(flows), strict=True):
                    cursor.execute(NEXT_DUE_OF, {"flow": flow, "version": version})
                    rows.extend(cursor.fetchall())
        times = [self._read_time(row[0]) for row in rows]
        return min(times) if times else None

    def explain_due_waits(self, flows=None):
        if flows is None:  # the flows this process would claim for (what its waker runs)
            from journal.flows import registry

            flows = registry.runnable()
        names, versions = flow_keys(flows)
        flow, version = (names[0], versions[0]) if names else ("", 0)  # one statement per flow, each the same plan
        with self.connection.cursor() as cursor:
            cursor.execute("EXPLAIN QUERY PLAN " + CLAIM_DUE, {"now": self._time(timezone.now()), "limit": 16,
                                                                "flow": flow, "version": version})
            claim = "; ".join(str(row[-1]) for row in cursor.fetchall())
            cursor.execute("EXPLAIN QUERY PLAN " + NEXT_DUE_OF, {"flow": flow, "version": version})
            probe = "; ".join(str(row[-1]) for row in cursor.fetchall())
        return {"plan": claim, "cost": None, "next_due_plan": probe, "next_due_cost": None}

    def carry_messages(self, from_id, to_id, now):
        with atomic(self.alias), self.connection.cursor() as cursor:
            cursor.execute(CARRY_MESSAGES, {"from": from_id, "to": to_id})
            topics = sorted({row[0] for row in cursor.fetchall()})
            cursor.execute(CARRY_FLOW_EVENTS, {"from": from_id, "to": to_id})
            for topic in topics:
                cursor.execute(WAKE, {"eid": to_id, "now": self._time(now), "topic": topic, "child": None})
        return len(topics)

    def wake_wait(self, execution_id, now, *, topic=None, child=None):
        with atomic(self.alias), self.connection.cursor() as cursor:
            cursor.execute(WAKE, {"eid": execution_id, "now": self._time(now), "topic": topic, "child": child})
            return cursor.rowcount > 0

    def drop_wait(self, execution_id):
        with self.connection.cursor() as cursor:
            cursor.execute(DROP_WAIT, [execution_id])

    def wait_of(self, execution_id):
        with self.connection.cursor() as cursor:
            cursor.execute(WAIT_OF, [execution_id])
            row = cursor.fetchone()
        if row is None:
            return None
        found = dict(zip(("kind", "pos", "token", "due_at", "topic", "child", "flow"), row, strict=True))
        found["due_at"] = self._read_time(found["due_at"])
        return found

    def set_execution_status(self, execution_id, token, status):
        with self.connection.cursor() as cursor:
            cursor.execute(SET_STATUS, [status, self._time(timezone.now()), execution_id, execution_id, token])
            return cursor.rowcount > 0

    def send_message(self, execution_id, topic, message_id, payload, now):
        with atomic(self.alias), self.connection.cursor() as cursor:
            cursor.execute(HEADER_STATUS, [execution_id])
            row = cursor.fetchone()
            status = None if row is None else row[0]
            if status is None or status in SETTLED_STATUSES:
                return status, False
            cursor.execute(SEND, [execution_id, topic, message_id, payload, self._time(now)])
            inserted = cursor.rowcount > 0
            if inserted:
                cursor.execute(WAKE, {"eid": execution_id, "now": self._time(now), "topic": topic, "child": None})
        return status, inserted

    def pending_message(self, execution_id, topic):
        with self.connection.cursor() as cursor:
            cursor.execute(PENDING_MESSAGE, [execution_id, topic])
            row = cursor.fetchone()
        return None if row is None else (row[0], row[1], json.loads(row[2]))

    def consume_message(self, row_id, seq, now):
        with self.connection.cursor() as cursor:
            cursor.execute(CONSUME, [self._time(now), seq, row_id])
            return cursor.rowcount == 1

    def messages_of(self, execution_id, limit):
        with self.connection.cursor() as cursor:
            cursor.execute(MESSAGES_OF, [execution_id, limit])
            rows = cursor.fetchall()
        return [{"message_id": r[0], "topic": r[1], "payload": json.loads(r[2]), "sent_at": self._read_time(r[3]),
                 "consumed_at": self._read_time(r[4])} for r in rows]

    def put_flow_event(self, execution_id, key, value):
        with self.connection.cursor() as cursor:
            cursor.execute(PUT_FLOW_EVENT, [execution_id, key, value, self._time(timezone.now())])

    def flow_event(self, execution_id, key):
        with self.connection.cursor() as cursor:
            cursor.execute(FLOW_EVENT, [execution_id, key])
            row = cursor.fetchone()
        return (False, None) if row is None else (True, json.loads(row[0]))

    def lock_stream(self, stream_id: str) -> None:
        """Nothing to run: the caller's transaction began IMMEDIATE, so it already holds the database's
        write lock, which serialises every writer (and so every locker of any stream) until it ends."""

    def save_snapshot(self, snapshot: SnapshotRecord) -> None:
        state = jsonvalues.dumps(snapshot.state, f"snapshot state of {snapshot.stream_id}")
        with self.connection.cursor() as cursor:
            cursor.execute(SAVE_SNAPSHOT, [snapshot.stream_id, snapshot.seq, state, self.now()])

    # == for other apps: fences, executions recovery, event reads ==
    sql = {"mark_recovered": MARK_RECOVERED, "mark_stuck": MARK_STUCK, "wake_stuck_parents": WAKE_STUCK_PARENTS,
           "count_recovery": COUNT_RECOVERY}

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
