"""What every backend store does, and the parts they share: grouping, encoding, diagnosis.

The journal's store is five small interfaces, layered as eventsourcing's recorders are: `LogStore`
(the guarded append, fences, snapshots, reads), `ExecutionStore` (headers written with the log),
`WaitStore` (flows that wait), `OtherAppsStore` (statements for leases and projections) and
`PrivacyStatements` (data keys, content links); `JournalStore` is all five, plus the benchmarks' and
tests' upkeep (journal/store/testing.py). A backend implements `_append` (one guarded statement, or the
SQLite equivalent under its write lock), `_open`, `advance_fence` and the rest of each interface's
abstract methods (docs/backends.md). The shared code validates before any SQL and turns guard failures
into the journal's exceptions, so callers never see a raw database error.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, InterfaceError, OperationalError, connections
from django.utils import timezone

from journal import conf
from journal.atomic import atomic
from journal.envelopes import Appended, AppendItem, SnapshotRecord, StoredEvent
from journal.exceptions import (
    AppendRefused,
    BatchRefused,
    DatabaseUnavailable,
    InvalidPayload,
    SequenceConflict,
    StaleFence,
    StreamExists,
    UnknownStream,
)
from journal.privacy import codec
from journal.reach import cannot_reach
from journal.store.testing import JournalUpkeep

if TYPE_CHECKING:
    from journal.flows.ownership import Companion

# "Key (stream_id, seq)=(abc, 4) already exists." in both PostgreSQL's detail and our SQLite re-raise; the
# message may carry it twice (psycopg puts DETAIL in str(exc) too), so the stream is matched lazily.
_KEY_DETAIL = re.compile(r"\(stream_id, seq\)=\((?P<stream>.*?), (?P<seq>-?\d+)\)")


class Verdict:
    """The guard outcome of one stream in an append, as the statement saw it."""

    __slots__ = ("expected", "fence_ok", "known", "stream_id", "tip")

    def __init__(self, stream_id: str, tip: int, fence_ok: bool, expected: int | None, known: bool = True):
        self.stream_id, self.tip, self.fence_ok, self.expected, self.known = stream_id, tip, fence_ok, expected, known

    @property
    def ok(self) -> bool:
        return self.fence_ok and (self.expected is None or self.expected == self.tip)


# == executions (flows): the header row written WITH the log ========================================
# The values the execution methods of JournalStore take (journal/flows/writer.py builds them in the
# caller's thread: validated and encoded before any SQL, also when a coalescer's flush thread writes).


@dataclass(slots=True)
class ExecutionBoot:
    """A fresh execution's bootstrap: its first events (sequence 0.., fence token 1) and its header."""

    item: AppendItem
    encoded: list[str]
    flow: str
    status: str
    input: str | None  # JSON text (journal.jsonvalues), like result
    result: str | None
    error: str
    finished: bool
    # An ownership's companion CTEs (journal/flows/ownership.py) writing an inline lease in the same
    # statement; only for a store with `one_statement_executions` (None: no lease written).
    companion: Companion | None = None
    lease_owner: str | None = None
    lease_ttl: float | None = None
    version: int = 1  # the flow version it starts on (journal/flows/registry.py started_version)


def flow_keys(flows: Sequence) -> tuple[list[str], list[int]]:
    """A worker's flows filter as two parallel lists for the stores' statements: names, and versions
    (0: any version). Entries are flow names (any version: what tests and maintenance pass) or
    (name, version) pairs (`runnable()`: what a worker passes)."""
    names, numbers = [], []
    for entry in flows:
        if isinstance(entry, str):
            names.append(entry)
            numbers.append(0)
        else:
            names.append(entry[0])
            numbers.append(int(entry[1]))
    return names, numbers


@dataclass(slots=True)
class ExecutionSettle:
    """A run's settling append (fenced, at its expected tip) and its header's terminal state."""

    item: AppendItem
    encoded: list[str]
    status: str
    result: str | None  # JSON text
    error: str
    # The settle also deletes this owner's lease row at the item's fence token (companion CTEs; only
    # for a store with `one_statement_executions`).
    companion: Companion | None = None
    lease_owner: str | None = None


#: Header statuses after which an execution takes no message, wake-up or suspend.
SETTLED_STATUSES = frozenset({"completed", "failed", "cancelled"})


@dataclass(slots=True)
class WaitRecord:
    """What a parked execution waits for (a row of journal_wait)."""

    execution_id: str
    flow: str
    kind: str  # sleep, recv, child, start, retry
    pos: int
    token: int
    due_at: datetime | None
    topic: str = ""
    child: str = ""


@dataclass(frozen=True, slots=True)
class ClaimedWait:
    """A wait a claim took: the execution now runs under `token` (the fence the claim advanced to)."""

    execution_id: str
    token: int
    flow: str
    kind: str
    pos: int


# -- execution_status --
# The header of one execution, for the error path of a refused start and the status reads of
# resume, cancel and the HTTP API. The same text on every backend.
# -- count_executions_by_status -- (the metrics page: one row per flow and status)
EXECUTIONS_BY_STATUS = "SELECT flow, status, count(*) FROM journal_execution GROUP BY flow, status"

EXECUTION_STATUS = "SELECT status, flow, result, error FROM journal_execution WHERE id = %s"

# -- message_sent -- whether a message id was sent to an execution: send()'s identity check once the
# recipient settled (a settled header takes no more messages, so no lock is needed: the answer cannot
# change but by a purge). One probe of the unique (execution_id, message_id) index; the same text on every
# backend.
MESSAGE_SENT = "SELECT 1 FROM journal_message WHERE execution_id = %s AND message_id = %s"

# -- hook: EXECUTION_STATUS_OF --
# One execution's header status (NULL while it has none) as a scalar subquery, for another app's
# statement that decides by it in the same statement (queues: a started entry whose execution settled
# frees its slot; a claimed one that never began is offered again). Format {eid} with the caller's
# column expression. It takes no lock: the caller serialises its own decisions (the queue's row).
# The same text on every backend (one primary-key probe).
EXECUTION_STATUS_OF = "(SELECT x.status FROM journal_execution x WHERE x.id = {eid})"

# -- hook: EXECUTION_VERSION_OF --
# One execution's flow version (NULL while it has no header) as a scalar subquery, as EXECUTION_STATUS_OF:
# for a claim in another app's statement that must take only executions of the versions its worker has
# (docs/flows.md "Versions and deploys"; a queued start whose header is written at enqueue). No lock.
EXECUTION_VERSION_OF = "(SELECT x.flow_version FROM journal_execution x WHERE x.id = {eid})"


def stream_exists(stream_id: str) -> StreamExists:
    """The refusal of a second bootstrap (or an open) of a stream that exists."""
    return StreamExists(f"stream {stream_id} already exists (its sequence 0 is written)", [stream_id])


class DatabaseBound:
    """A store of one database alias; the connection is looked up per call (connections are per thread)."""

    vendor = ""

    def __init__(self, alias: str):
        self.alias = alias

    @property
    def connection(self):
        return connections[self.alias]

    def _rows(self, sql: str, params) -> list[tuple]:
        """Run one statement; its rows, or [] for a statement that returns none (every app's store)."""
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall() if cursor.description else []

    def _count(self, sql: str, params) -> int:
        """Run one statement; the number of rows it changed."""
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.rowcount

    def bulk_load(self, table: str, columns: Sequence[str], rows: Iterable[tuple]) -> None:
        """Benchmarks only (the `growth` section's pre-filled tables): load `rows` into a table of the
        calling store's own app in one transaction, as fast as the backend allows: COPY on PostgreSQL,
        one executemany on SQLite. The caller names its own table (each app's store passes its own),
        so the rule of one owner per table holds."""
        cols = ", ".join(columns)
        with atomic(self.alias), self.connection.cursor() as cursor:
            if self.connection.vendor == "postgresql":
                with cursor.cursor.copy(f"COPY {table} ({cols}) FROM STDIN") as copy:
                    for row in rows:
                        copy.write_row(row)
            else:
                cursor.executemany(f"INSERT INTO {table} ({cols}) VALUES ({', '.join(['%s'] * len(columns))})",
                                   rows)


    def analyze(self, *tables: str) -> None:
        """Benchmarks only: refresh the planner's statistics of the caller's own tables after a
        bulk load (autovacuum would, later), so the plans measured are the ones a live system has."""
        with self.connection.cursor() as cursor:
            for table in tables:
                cursor.execute(f"ANALYZE {table}")

    def checkpoint(self) -> str | None:
        """Benchmarks only: write a bulk load out before measuring (a 10^7-event fill leaves gigabytes of
        WAL behind, and every commit measured meanwhile waits for that writing, not for its own plan).
        PostgreSQL: CHECKPOINT (superuser or pg_checkpoint); SQLite: a WAL checkpoint. None when done, else
        why not (the caller records it: its cells then measure during the write-out)."""
        from django.db import DatabaseError

        try:
            with self.connection.cursor() as cursor:
                if self.connection.vendor == "postgresql":
                    cursor.execute("CHECKPOINT")
                else:
                    cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except DatabaseError as exc:
            return str(exc).strip().splitlines()[0]
        return None

# == personal data: data keys and content links (journal/privacy) ====================================
# One row per data subject in journal_datakey; forgetting writes that one row whatever the number of
# events, and nothing in journal_event. The statements are the same text on both backends (SQLite
# has had ON CONFLICT and RETURNING since 3.24 and 3.35).

class PrivacyStatements:
    """The journal store's personal-data section (a mixin of JournalStore)."""

    def data_keys(self, subjects: Sequence[str]) -> dict[str, tuple[str, str | None]]:
        """subject -> (master id, wrapped key or None if forgotten) of every subject that has a row."""
        out: dict[str, tuple[str, str | None]] = {}
        with self.connection.cursor() as cursor:
            for start in range(0, len(subjects), 500):
                part = list(subjects[start:start + 500])
                cursor.execute(DATA_KEYS.format(marks=", ".join(["%s"] * len(part))), part)
                out.update({row[0]: (row[1], row[2]) for row in cursor.fetchall()})
        return out

    def create_data_keys(self, rows: Sequence[tuple[str, str, str]]) -> None:
        """Insert (subject, master id, wrapped) for subjects that have no row; a row already there (another
        writer's key, or a forgotten subject's tombstone) is kept."""
        with self.guarded(), self.connection.cursor() as cursor:
            for subject, master_id, wrapped in rows:
                cursor.execute(CREATE_DATA_KEY, [subject, master_id, wrapped, self.now()])

    def forget_subject(self, subject: str, by: str) -> list[str]:
        """Destroy the subject's data key (a tombstone row if it had none); the content it owned is
        unlinked and returned (SHA-256s no other subject links), for the caller to erase."""
        with self.guarded(), self.connection.cursor() as cursor:
            now = self.now()
            cursor.execute(FORGET_SUBJECT, [subject, now, now, by[:200]])
            cursor.execute(UNLINK_CONTENT, [subject])
            shas = sorted({row[0] for row in cursor.fetchall()})
            if not shas:
                return []
            cursor.execute(STILL_LINKED.format(marks=", ".join(["%s"] * len(shas))), shas)
            kept = {row[0] for row in cursor.fetchall()}
        return [sha for sha in shas if sha not in kept]

    def data_keys_to_rotate(self, current: str, limit: int) -> list[tuple[str, str, str]]:
        """(subject, master id, wrapped) of live keys not wrapped by the `current` master key."""
        with self.connection.cursor() as cursor:
            cursor.execute(KEYS_TO_ROTATE, [current, limit])
            return cursor.fetchall()

    def rewrap_data_key(self, subject: str, old_wrapped: str, master_id: str, wrapped: str) -> int:
        """Replace one subject's wrapped key if it is still `old_wrapped` (not forgotten meanwhile)."""
        with self.guarded(), self.connection.cursor() as cursor:
            cursor.execute(REWRAP_DATA_KEY, [master_id, wrapped, subject, old_wrapped])
            return cursor.rowcount

    def master_key_ids(self) -> dict[str, tuple[str, str]]:
        """Each master key id in use, with one wrapped key of it and that key's subject (the start-up check
        unwraps it: a wrapped key is bound to its subject)."""
        with self.connection.cursor() as cursor:
            cursor.execute(MASTER_KEY_IDS)
            return {row[0]: (row[1], row[2]) for row in cursor.fetchall()}

    def delete_privacy_rows(self, subject_prefix: str, shas: Sequence[str] = ()) -> None:
        """Benchmarks and tests only: delete the key rows of the subjects under `subject_prefix` and the content
        links of theirs and of `shas` (maintenance of their own rows; the write path never deletes a key row)."""
        with self.connection.cursor() as cursor:
            cursor.execute(DELETE_DATA_KEYS, [subject_prefix + "%"])
            cursor.execute(DELETE_CONTENT_LINKS, [subject_prefix + "%"])
            for start in range(0, len(shas), 500):
                part = list(shas[start:start + 500])
                cursor.execute(DELETE_CONTENT_LINKS_OF.format(marks=", ".join(["%s"] * len(part))), part)

    def link_content(self, links: Sequence[tuple[str, str]]) -> None:
        """Record (sha256, subject) links of content just stored (once each)."""
        with self.guarded(), self.connection.cursor() as cursor:
            for sha, subject in sorted(set(links)):
                cursor.execute(LINK_CONTENT, [sha, subject, self.now()])


# -- data_keys -- (one statement per read batch: every subject of the batch)
DATA_KEYS = "SELECT subject, master_id, wrapped FROM journal_datakey WHERE subject IN ({marks})"

# -- create_data_key -- a race for a new subject has one winner; a tombstone is never replaced, so a
# forgotten subject cannot be given a fresh key by a writer that did not see the forget yet.
CREATE_DATA_KEY = """
INSERT INTO journal_datakey (subject, master_id, wrapped, created_at, forgotten_by)
VALUES (%s, %s, %s, %s, '') ON CONFLICT (subject) DO NOTHING
"""

# -- forget_subject -- the key is destroyed by overwriting its only copy; the row stays as a tombstone.
FORGET_SUBJECT = """
INSERT INTO journal_datakey (subject, master_id, wrapped, created_at, forgotten_at, forgotten_by)
VALUES (%s, '', NULL, %s, %s, %s)
ON CONFLICT (subject) DO UPDATE SET master_id = '', wrapped = NULL, forgotten_at = excluded.forgotten_at,
    forgotten_by = excluded.forgotten_by
"""

# -- unlink_content / still_linked --
UNLINK_CONTENT = "DELETE FROM journal_contentlink WHERE subject = %s RETURNING sha256"
STILL_LINKED = "SELECT DISTINCT sha256 FROM journal_contentlink WHERE sha256 IN ({marks})"

# -- link_content --
LINK_CONTENT = """
INSERT INTO journal_contentlink (sha256, subject, created_at) VALUES (%s, %s, %s)
ON CONFLICT (sha256, subject) DO NOTHING
"""

# -- keys_to_rotate / rewrap_data_key -- compare-and-set on the wrapped text: a forget in between wins.
KEYS_TO_ROTATE = """
SELECT subject, master_id, wrapped FROM journal_datakey
WHERE wrapped IS NOT NULL AND master_id <> %s ORDER BY subject LIMIT %s
"""
REWRAP_DATA_KEY = "UPDATE journal_datakey SET master_id = %s, wrapped = %s WHERE subject = %s AND wrapped = %s"

# -- delete_privacy_rows -- (benchmarks and tests: their own subjects and content only)
DELETE_DATA_KEYS = "DELETE FROM journal_datakey WHERE subject LIKE %s"
DELETE_CONTENT_LINKS = "DELETE FROM journal_contentlink WHERE subject LIKE %s"
DELETE_CONTENT_LINKS_OF = "DELETE FROM journal_contentlink WHERE sha256 IN ({marks})"

# -- master_key_ids --
MASTER_KEY_IDS = """
SELECT k.master_id, k.wrapped, MIN(k.subject) FROM journal_datakey k
JOIN (SELECT master_id, MIN(wrapped) AS wrapped FROM journal_datakey WHERE wrapped IS NOT NULL GROUP BY master_id) m
  ON k.master_id = m.master_id AND k.wrapped = m.wrapped
GROUP BY k.master_id, k.wrapped
"""


class LogStore(DatabaseBound, ABC):
    """The log: guarded all-or-nothing appends, fences, snapshots and reads (the first of the journal's five
    interfaces, eventsourcing's AggregateRecorder; docs/backends.md). The layers above add to it."""


    # -- writes ---------------------------------------------------------------------------------
    def append_batch(self, items: Sequence[AppendItem]) -> list[Appended]:
        """Append every item, each stream under its own guards, in one statement; all or nothing."""
        if not items:
            return []
        if len(items) > 1 and len({item.stream_id for item in items}) < len(items):
            seen: set[str] = set()
            for item in items:
                if item.stream_id in seen:
                    raise InvalidPayload(f"stream {item.stream_id} appears twice in one batch; merge its envelopes")
                seen.add(item.stream_id)
        return self.append_encoded(items, self.encode(items))

    def encode(self, items: Sequence[AppendItem]) -> list[list[str]]:
        """Validate and encode every payload (before any SQL); raises InvalidPayload. Marked fields are
        sealed here (journal/privacy: one set lookup per batch when nothing is marked)."""
        limit = conf.get("LOOM_MAX_PAYLOAD_BYTES")
        if codec.needs_seal(items):
            return [[env.encode(limit) for env in codec.seal(self, item.envelopes, stream_id=item.stream_id)]
                    for item in items]
        refuse = codec.refuse_reserved  # a payload we did not seal may not look sealed (every append: one set test)
        encoded = []
        for item in items:
            texts = []
            for env in item.envelopes:
                refuse(env.type, env.payload)
                texts.append(env.encode(limit))
            encoded.append(texts)
        return encoded

    def append_encoded(self, items: Sequence[AppendItem], encoded: list[list[str]]) -> list[Appended]:
        """The guarded statement for items already validated by `encode` (distinct streams).

        The coalescer encodes in each caller's thread and calls this from its flush thread.
        """
        try:
            verdicts = self._append(items, encoded)
        except IntegrityError as exc:
            raise self.sequence_conflict(items, exc) from None
        except (OperationalError, InterfaceError) as exc:
            if not cannot_reach(exc):
                raise
            # The server went away under the statement (a restart, a failover): the commit may or may not have
            # been stored. Named and retryable; the guards decide on a retry (journal/exceptions.py).
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise DatabaseUnavailable(f"append to {', '.join(i.stream_id for i in items[:3])}: the database could "
                                      f"not be reached ({first}); in doubt: retry with the same guards") from exc
        return self.appended(items, verdicts)

    def appended(self, items: Sequence[AppendItem], verdicts: list[Verdict]) -> list[Appended]:
        """THE verdict -> outcome translation of every guarded append (plain, or settling executions):
        what each item was given, or the journal's exception if any guard failed (nothing written)."""
        if len(verdicts) == 1:  # the per-event append: no generator, no zip
            v = verdicts[0]
            if v.fence_ok and (v.expected is None or v.expected == v.tip):  # Verdict.ok
                item = items[0]
                return [Appended(item.stream_id, v.tip + 1, v.tip + len(item.envelopes))]
            raise self.refusal(items, verdicts)
        if all(v.ok for v in verdicts):
            return [
                Appended(item.stream_id, v.tip + 1, v.tip + len(item.envelopes))
                for item, v in zip(items, verdicts, strict=True)
            ]
        raise self.refusal(items, verdicts)

    def open_stream(self, item: AppendItem) -> tuple[int, Appended]:
        """Write seq 0.. of a new single-writer stream with fence token 1, or refuse if it exists."""
        encoded = self.encode([item])[0]
        try:
            opened = self._open(item, encoded)
        except IntegrityError:
            opened = False
        if not opened:
            raise StreamExists(f"stream {item.stream_id} already exists (its sequence 0 is written)",
                               [item.stream_id])
        return 1, Appended(item.stream_id, 0, len(item.envelopes) - 1)

    @abstractmethod
    def _append(self, items: Sequence[AppendItem], encoded: list[list[str]]) -> list[Verdict]:
        """Run the guarded append; return one verdict per item, in order. Writes nothing unless all pass."""

    @abstractmethod
    def _open(self, item: AppendItem, encoded: list[str]) -> bool:
        """Insert fence token 1 and the events from seq 0 together; False if the fence already existed."""

    @abstractmethod
    def advance_fence(self, stream_id: str, expected_token: int | None = None) -> int:
        """Bump the stream's fence token and return it; raise UnknownStream or StaleFence."""

    @abstractmethod
    def save_snapshot(self, snapshot: SnapshotRecord) -> None: ...

    @abstractmethod
    def lock_stream(self, stream_id: str) -> None:
        """Queue behind other lockers of this stream until the caller's transaction ends.

        Only an aid to fairness (aggregates' retries take it so that losers of a race stop fighting
        each other); appends never depend on it. Must be called inside a transaction."""

    def fence_refusal(self, stream_id: str, expected_token: int | None) -> AppendRefused:
        """Why an advance_fence changed nothing: no fence at all, or not the expected token."""
        current = self.current_fence(stream_id)
        if current is None:
            return UnknownStream(f"stream {stream_id} has no fence to advance", [stream_id])
        return StaleFence(f"fence of {stream_id} is {current}, not the expected {expected_token}", [stream_id])

    # -- reads ----------------------------------------------------------------------------------
    def read(self, stream_id: str, after_seq: int = -1, limit: int | None = None,
             reader: codec.Reader | None = None) -> list[StoredEvent]:
        """Events of a stream after `after_seq`, as `reader` may see them (None: the system)."""
        sql = ("SELECT id, stream_id, seq, type, payload, recorded_at FROM journal_event"
               " WHERE stream_id = %s AND seq > %s ORDER BY seq")
        params: list = [stream_id, after_seq]
        if limit is not None:
            sql += " LIMIT %s"
            params.append(limit)
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            events = [self._event(row) for row in cursor.fetchall()]
        return self.reveal(events, reader)

    def reveal(self, events: list[StoredEvent], reader: codec.Reader | None = None) -> list[StoredEvent]:
        """THE decode boundary of every read: sealed fields decrypted (or marked), stored-away content
        resolved, a whole batch at once (journal/privacy/codec.py); nothing to do when nothing is sealed."""
        return codec.reveal(self, events, reader) if events and codec.active() else events

    def reveal_found(self, found: dict) -> dict:
        """`reveal` of read_after's answer, every list in one batch."""
        if not found or not codec.active():
            return found
        flat = [e for events in found.values() for e in events]
        shown = iter(codec.reveal(self, flat))
        return {pair: [next(shown) for _ in events] for pair, events in found.items()}

    def _event(self, row: tuple) -> StoredEvent:
        return StoredEvent.from_row(row)

    def tip(self, stream_id: str) -> int:
        with self.connection.cursor() as cursor:
            cursor.execute(
                "SELECT seq FROM journal_event WHERE stream_id = %s ORDER BY seq DESC LIMIT 1", [stream_id]
            )
            row = cursor.fetchone()
        return -1 if row is None else row[0]

    def current_fence(self, stream_id: str) -> int | None:
        with self.connection.cursor() as cursor:
            cursor.execute("SELECT token FROM journal_fence WHERE stream_id = %s", [stream_id])
            row = cursor.fetchone()
        return None if row is None else row[0]

    def latest_snapshot(self, stream_id: str) -> SnapshotRecord | None:
        with self.connection.cursor() as cursor:
            cursor.execute(
                "SELECT seq, state FROM journal_snapshot WHERE stream_id = %s ORDER BY seq DESC LIMIT 1",
                [stream_id],
            )
            row = cursor.fetchone()
        if row is None:
            return None
        state = json.loads(row[1]) if isinstance(row[1], str) else row[1]
        return SnapshotRecord(stream_id, row[0], state)

    def prepare_flush_connection(self, lock_timeout_ms: int) -> bool:
        """Called by the coalescer's flush threads before each statement on their own connection:
        replace it if the server dropped it, and bound its row-lock waits. True if it reconnected.
        Default: nothing (SQLite has no server to drop it and no row locks: one write lock per file,
        for which a direct write would wait all the same)."""
        return False

    # -- the public surface for statements composed on top of the journal's (journal/flows) ------
    @contextmanager
    def guarded(self):
        """A savepoint when the caller is inside a transaction, so our failure does not poison theirs."""
        if self.connection.in_atomic_block:
            with atomic(self.alias):
                yield
        else:
            yield

    def execute_guarded(self, sql: str, params) -> list[tuple]:
        """Run one statement under `guarded()` and return its rows (the backend may prepare it).

        IntegrityError propagates (callers turn it into their own errors with `sequence_conflict`).
        """
        with self.guarded(), self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall() if cursor.description else []

    def now(self):
        """The current time as this backend stores it in a datetime column (for literal inserts)."""
        return self.connection.ops.adapt_datetimefield_value(timezone.now())

    # -- shared helpers -------------------------------------------------------------------------

    def _known_streams(self, stream_ids: list[str]) -> set[str]:
        """Streams that exist (have a fence or an event); read only on the error path."""
        if not stream_ids:
            return set()
        marks = ", ".join(["%s"] * len(stream_ids))
        with self.connection.cursor() as cursor:
            cursor.execute(
                f"SELECT stream_id FROM journal_fence WHERE stream_id IN ({marks})"
                f" UNION SELECT DISTINCT stream_id FROM journal_event WHERE stream_id IN ({marks})",
                stream_ids + stream_ids,
            )
            return {row[0] for row in cursor.fetchall()}

    def refusal(self, items: Sequence[AppendItem], verdicts: list[Verdict]) -> AppendRefused:
        """The journal's exception for failed verdicts: the one error of a single item, else BatchRefused."""
        failed = [v for v in verdicts if not v.ok]
        known = self._known_streams([v.stream_id for v in failed])
        errors: dict[str, AppendRefused] = {}
        for v in failed:
            sid = v.stream_id
            if sid not in known:
                errors[sid] = UnknownStream(f"stream {sid} does not exist", [sid])
            elif not v.fence_ok:
                current = self.current_fence(sid)
                given = next(i.fence_token for i in items if i.stream_id == sid)
                if current is None:
                    errors[sid] = UnknownStream(f"stream {sid} has no fence; it was not opened as single-writer",
                                                [sid])
                else:
                    errors[sid] = StaleFence(
                        f"stale fence on {sid}: token {given} is not the current {current}; nothing written", [sid]
                    )
            else:
                errors[sid] = SequenceConflict(
                    f"sequence conflict on {sid}: expected tip {v.expected}, found {v.tip}; nothing written", [sid]
                )
        if len(items) == 1:
            return next(iter(errors.values()))
        return BatchRefused(errors)

    def sequence_conflict(self, items: Sequence[AppendItem], exc: IntegrityError) -> AppendRefused:
        """A unique (stream_id, seq) violation: a concurrent writer took a seq this call wanted."""
        match = _KEY_DETAIL.search(_detail(exc))
        culprit = match.group("stream") if match else None
        streams = [culprit] if culprit else [item.stream_id for item in items]
        errors = {
            sid: SequenceConflict(f"sequence conflict on {sid}: a concurrent writer appended first; nothing written",
                                  [sid])
            for sid in streams
        }
        if len(items) == 1:
            return next(iter(errors.values()))
        return BatchRefused(errors)


class ExecutionStore(LogStore, ABC):
    """Execution headers written WITH the log: a durable run's bootstrap and settle (journal/flows/writer.py)."""

    # == executions (flows): the header row written WITH the log ====================================
    # A durable run's bootstrap and settle write the Execution header together with the log, in the
    # same statement (PostgreSQL) or transaction (SQLite), so a reader never sees a settled log with
    # a running header, or a header without its log. journal/flows/writer.py decides what to write
    # when; these methods are the only code that writes it. Refusals are the journal's own errors.

    #: True: a bootstrap and a settle are each ONE statement, which may carry an ownership's companion
    #: CTEs (the inline lease), and many executions' merge into one (the coalescer's flows kinds).
    #: False: each is a short transaction of plain statements, no companion; many executions' merge
    #: into ONE transaction (the coalescer's flows kinds: group commit under the write lock).
    one_statement_executions = False

    def bootstrap_execution(self, boot: ExecutionBoot) -> int:
        """Sequence 0.. with fence token 1 and the header row; returns the token (1). StreamExists if
        the id exists (a fence, or the events of an aggregate stream); nothing is written then."""
        try:
            opened = self._bootstrap(boot)
        except IntegrityError:
            opened = False
        if not opened:
            raise stream_exists(boot.item.stream_id)
        return 1

    def bootstrap_many(self, boots: Sequence[ExecutionBoot]) -> list[int | StreamExists]:
        """Many bootstraps at once (distinct ids): per execution its token 1, or StreamExists (nothing
        written for it; the others start all the same). Raises when the statement wrote nothing at
        all: an id with events but no fence (an aggregate stream) fails the whole statement; the
        error names it (BatchRefused of StreamExists; a batch of one: its StreamExists)."""
        items = [boot.item for boot in boots]
        try:
            won = self._bootstrap_many(boots)
        except IntegrityError as exc:
            refused = self.sequence_conflict(items, exc)
            named = refused.errors if isinstance(refused, BatchRefused) else {items[0].stream_id: refused}
            if len(items) == 1:
                raise stream_exists(items[0].stream_id) from None
            raise BatchRefused({sid: stream_exists(sid) for sid in named}) from None
        return [1 if item.stream_id in won else stream_exists(item.stream_id) for item in items]

    def settle_execution(self, settle: ExecutionSettle) -> Appended:
        """The run's settling events (fenced, at the expected tip) and its header's terminal state,
        together; refused exactly like append_encoded (StaleFence after a takeover...), and then
        nothing is written: no event, no header change, no lease deleted."""
        return self.settle_many([settle])[0]

    def settle_many(self, settles: Sequence[ExecutionSettle]) -> list[Appended]:
        """Many settles at once (distinct ids), all or nothing like append_encoded: BatchRefused
        names the refused (the caller writes the others again without them)."""
        items = [settle.item for settle in settles]
        try:
            verdicts = self._settle(settles)
        except IntegrityError as exc:
            raise self.sequence_conflict(items, exc) from None
        return self.appended(items, verdicts)

    def execution_status(self, execution_id: str) -> tuple[str, str, Any, str] | None:
        """(status, flow, result, error) of the execution's header row, or None if it has none."""
        with self.connection.cursor() as cursor:
            cursor.execute(EXECUTION_STATUS, [execution_id])
            row = cursor.fetchone()
        if row is None:
            return None
        result = json.loads(row[2]) if isinstance(row[2], str) else row[2]
        return row[0], row[1], result, row[3]


    def count_executions_by_status(self) -> list[tuple[str, str, int]]:
        """(flow, status, count) of the execution headers, for the metrics page (journal/telemetry.py); no
        lock: a scrape reads a snapshot, the next one the next."""
        return [(flow, status, int(n)) for flow, status, n in self._rows(EXECUTIONS_BY_STATUS, [])]
    def message_sent(self, execution_id: str, message_id: str) -> bool:
        """Whether `message_id` was sent to the execution (consumed or not)."""
        with self.connection.cursor() as cursor:
            cursor.execute(MESSAGE_SENT, [execution_id, message_id])
            return cursor.fetchone() is not None

    @abstractmethod
    def _bootstrap(self, boot: ExecutionBoot) -> bool:
        """Fence token 1, the events from seq 0 and the header, together; False (or IntegrityError)
        if the fence already existed, and then nothing is written."""

    @abstractmethod
    def _bootstrap_many(self, boots: Sequence[ExecutionBoot]) -> set[str]:
        """`_bootstrap` of each execution; the ids that started. IntegrityError: nothing written."""

    @abstractmethod
    def _settle(self, settles: Sequence[ExecutionSettle]) -> list[Verdict]:
        """The guarded append of the settling events and, only if every guard passed, the headers
        (and the companion's lease deletes); one verdict per settle, in order."""


class WaitStore(ExecutionStore, ABC):
    """Flows that wait: parked executions' wait rows, messages and flow events (journal/flows/waits.py)."""

    # == waits (flows that wait: journal/flows/waits.py) ==========================================
    # A parked execution has one row in journal_wait (what it waits for, until when, under which
    # fence); messages wait in journal_message until a recv consumes them; ctx.set_event values live in
    # journal_flowevent. A header lock orders park, send and a child's wake-up (see each backend):
    # a message or a settle that lands while an execution parks is either seen by the park or wakes
    # the row the park committed, never lost in between.

    #: Whether this backend notifies waits made due and flow events (PostgreSQL NOTIFY on
    #: LOOM_WAIT_CHANNEL); without it the waker and get_event poll.
    wait_notifications = False

    @abstractmethod
    def lock_execution(self, execution_id: str) -> str | None:
        """Lock the execution's header in the caller's transaction (the first lock of park, send and
        a takeover of a parked execution: one order, no deadlock); its status, None if unknown."""

    @abstractmethod
    def park(self, wait: WaitRecord, status: str) -> datetime | bool | None:
        """Under the run's fence (`wait.token`), in one transaction: lock the header, upsert the wait
        row and set the header to `status` (waiting). A recv whose topic already has a pending message,
        or a child wait whose child has settled, is parked due now. Returns the due time written (None:
        no timer), or False if the fence moved on (nothing written)."""

    @abstractmethod
    def claim_due_waits(self, now: datetime, limit: int, flows: Sequence[str | tuple[str, int]] | None
                        ) -> list[ClaimedWait]:
        """Take up to `limit` waits due at `now` (of `flows`: names, or (name, version) pairs whose
        executions started on that version, flow_keys; None: any): each row deleted, its fence
        advanced from the parked token and its header set running (updated_at now), in one
        transaction. Two claimers never take the same row. Rows outlived by a takeover (fence moved)
        are deleted and not returned."""

    @abstractmethod
    def next_wait_due(self, flows: Sequence[str | tuple[str, int]] | None = None) -> datetime | None:
        """The earliest due time of the waits of `flows` (one probe of the (flow, due_at) index per flow;
        None: of any flow, maintenance and tests only: it sorts every timer row), or None."""

    @abstractmethod
    def explain_due_waits(self, flows: Sequence[str] | None = None) -> dict:
        """The plans of the waker's due statements for `flows` (None: those registered in this process)
        (claim and next due), explained, never
        run (the bench records their growth with the number of waits): {"plan", "cost", "next_due_plan",
        "next_due_cost"}; PostgreSQL: EXPLAIN (FORMAT JSON), cost the top node's total; SQLite: EXPLAIN
        QUERY PLAN, cost None."""

    @abstractmethod
    def carry_messages(self, from_id: str, to_id: str, now: datetime) -> int:
        """In a continue_as_new's settle transaction: move `from_id`'s unconsumed messages to the next
        run `to_id` (ids and message_ids kept; one `to_id` has already stays), waking its recv of their
        topics, and copy its flow events (`to_id`'s own win); returns the number of topics moved."""

    @abstractmethod
    def wake_wait(self, execution_id: str, now: datetime, *, topic: str | None = None,
                  child: str | None = None) -> bool:
        """Make the execution's wait due now (only a recv of `topic`, or a wait for `child`, if given),
        under its header lock; False if it waits for nothing of the kind."""

    @abstractmethod
    def drop_wait(self, execution_id: str) -> None:
        """Delete the execution's wait row, if any (it settled, or was suspended)."""

    @abstractmethod
    def wait_of(self, execution_id: str) -> dict | None:
        """The wait row as a dict (kind, pos, token, due_at, topic, child, flow), or None."""

    @abstractmethod
    def set_execution_status(self, execution_id: str, token: int, status: str) -> bool:
        """Set a header's status (running, waiting, suspended) if the fence is still `token`, in the
        caller's transaction; False (nothing written) otherwise."""

    @abstractmethod
    def send_message(self, execution_id: str, topic: str, message_id: str, payload: str,
                     now: datetime) -> tuple[str | None, bool]:
        """(header status, inserted): under the recipient's header lock, keep the message (JSON text)
        unless the recipient is unknown (status None) or settled, or `message_id` was sent before
        (inserted False); wake a recv of its topic. Nothing is written in the refused cases."""

    @abstractmethod
    def pending_message(self, execution_id: str, topic: str) -> tuple[int, str, Any] | None:
        """(row id, message_id, payload) of the oldest unconsumed message of the topic, or None."""

    @abstractmethod
    def consume_message(self, row_id: int, seq: int, now: datetime) -> bool:
        """Mark a message consumed (by the event at `seq`), in the caller's transaction; False if
        it was consumed already."""

    @abstractmethod
    def messages_of(self, execution_id: str, limit: int) -> list[dict]:
        """The newest messages of an execution (admin): message_id, topic, payload, sent_at, consumed_at."""

    @abstractmethod
    def put_flow_event(self, execution_id: str, key: str, value: str) -> None:
        """Set (or overwrite) an execution's event `key` (JSON text), in the caller's transaction;
        notified on LOOM_WAIT_CHANNEL where the backend can."""

    @abstractmethod
    def flow_event(self, execution_id: str, key: str) -> tuple[bool, Any]:
        """(found, value) of an execution's event `key`."""


class OtherAppsStore(LogStore, ABC):
    """The statements other apps' stores need on the journal's tables (leases' takeover, projections' scans)."""

    # == for other apps: fences, executions recovery, event reads ====================================
    # The statements other apps' stores need on the journal's tables (leases' takeover, projections'
    # correlation and reads) and the benchmarks' counts and clean-up. They run on the caller's
    # connection and inside the caller's transaction (no savepoint of their own): a takeover's fence
    # advance commits with its lease claim. Fragments that must ride inside another app's statement
    # (one round trip) are module constants of each backend: CURRENT_FENCE_JOIN, STREAM_TIP_SQL,
    # RECOVERY_CANDIDATES (docs/architecture.md, "How the parts fit").

    def advance_fences(self, stream_ids: Sequence[str]) -> list[tuple[str, int]]:
        """Bump the fence of every stream that has one, in the caller's transaction; (stream, new token)
        of each, in stream order. The one fence-advance statement, shared with advance_fence."""
        if not stream_ids:
            return []
        return sorted(self._advance_fences(stream_ids, None))

    @abstractmethod
    def _advance_fences(self, stream_ids: Sequence[str], expected_token: int | None) -> list[tuple[str, int]]:
        """Run ADVANCE_FENCES on the current connection (no transaction of its own)."""

    def mark_recovered(self, execution_ids: Sequence[str]) -> int:
        """Count one more recovery on each execution header (the leases sweep took it over)."""
        return self._run_count(self.sql["mark_recovered"], execution_ids)

    def count_recovery(self, execution_id: str, token: int) -> bool:
        """Count one recovery attempt of a running execution whose fence is still `token` (the takeover's):
        called once the resumed run reached the database, before the flow's code runs; False if the fence
        moved on (another run took it over) or it is no longer running."""
        with self.connection.cursor() as cursor:
            cursor.execute(self.sql["count_recovery"], {"eid": execution_id, "token": token, "now": self.now()})
            return cursor.rowcount == 1

    def mark_stuck(self, execution_ids: Sequence[str]) -> int:
        """Mark the executions stuck: recovery gave up after LOOM_RECOVERY_MAX_ATTEMPTS. A parent waiting
        for one of them is made due now (a stuck child ends its wait: ChildFailed 'stuck'), not left to
        its LOOM_WAIT_RECHECK."""
        count = self._run_count(self.sql["mark_stuck"], execution_ids)
        if count:
            self._run_count(self.sql["wake_stuck_parents"], execution_ids)
        return count

    def _run_count(self, sql: str, execution_ids: Sequence[str]) -> int:
        if not execution_ids:
            return 0
        with self.connection.cursor() as cursor:
            cursor.execute(sql, {"eids": self._id_list(execution_ids), "now": self.now()})
            return cursor.rowcount

    #: Named statements of this section whose text differs per backend (set by each backend).
    sql: dict[str, str] = {}

    def _id_list(self, ids: Sequence[str]):
        """How this backend passes a list of ids as one parameter (an array; a JSON text on SQLite)."""
        return list(ids)

    def scan_events(self, after_id: int, limit: int) -> list[tuple[int, str, int, str]]:
        """(id, stream_id, seq, type) of the events after global position `after_id`, in id order."""
        with self.connection.cursor() as cursor:
            cursor.execute(SCAN_EVENTS, [after_id, limit])
            return cursor.fetchall()

    def last_event_id(self) -> int:
        """The highest global position written so far (0 for an empty log)."""
        with self.connection.cursor() as cursor:
            cursor.execute(LAST_EVENT_ID)
            return cursor.fetchone()[0]

    @abstractmethod
    def read_after(self, pairs: Sequence[tuple[str, int]], batch: int) -> dict[tuple[str, int], list[StoredEvent]]:
        """For each distinct (stream, seq): up to `batch` events of the stream after that seq, in order."""


class JournalStore(WaitStore, OtherAppsStore, PrivacyStatements, JournalUpkeep, ABC):
    """The journal's store: its five interfaces (LogStore, ExecutionStore, WaitStore, OtherAppsStore,
    PrivacyStatements), and the benchmarks' and tests' upkeep, shared (journal/store/testing.py)."""


# -- scan_events --
# A primary-key range: what correlation has not settled yet, in id order. Ids may be missing (rolled
# back, or not committed yet on PostgreSQL): projections' horizon logic decides which gaps are final.
SCAN_EVENTS = "SELECT id, stream_id, seq, type FROM journal_event WHERE id > %s ORDER BY id LIMIT %s"

# -- last_event_id --
LAST_EVENT_ID = "SELECT COALESCE(MAX(id), 0) FROM journal_event"

def _detail(exc: BaseException) -> str:
    cause = exc.__cause__
    diag = getattr(cause, "diag", None)
    parts = [str(exc)]
    if diag is not None and diag.message_detail:
        parts.append(diag.message_detail)
    return " ".join(parts)
