"""The lean per-event append on SQLite: one guarded statement on the driver's connection (issue 33).

The embedded default's per-event append was Django's transaction and cursor layers around five short
statements (BEGIN IMMEDIATE, the fence read, the tip read, the INSERT, COMMIT): 0.13-0.20x the minimal
sqlite3 statement in the `append` section. An append of ONE event to ONE stream, by a caller in
autocommit (no atomic block, no manual transaction), is here one INSERT whose seq is the tip + 1 only if
both guards pass (NULL otherwise, and the row is skipped): LEAN_APPEND_AT when the tip is known (the
caller's expected_seq, or the seq this process last wrote there), LEAN_APPEND when it must be read.
SQLite runs an autocommit statement under its write lock, so the guards are read and the row written
with no other writer in between, as in the IMMEDIATE transaction. It commits on its own.

Same semantics as SqliteStore._append:
- the fence and expected-seq guards, read under the write lock with the insert;
- a refused statement writes nothing; the refusal's verdicts come from the transactional path, which
  reads the guards again under the write lock and writes if they now pass (another writer's commit
  between the two), so the caller's outcome is always what one transaction saw;
- a remembered tip is a guess the statement checks: a wrong one writes nothing, and LEAN_APPEND reads it;
- driver errors are Django's (`wrap_database_errors`: IntegrityError, OperationalError "database is
  locked" after the busy timeout), as through a Django cursor.
Not taken (the transactional path runs instead): inside a transaction; several streams or events;
while Django logs queries (DEBUG, CaptureQueriesContext: tests count statements) or an execute
wrapper is installed (telemetry, tests): those observe every statement through Django's cursor.
"""

from __future__ import annotations

from datetime import UTC, datetime
from time import time_ns

from django.utils import timezone

from journal.envelopes import AppendItem
from journal.store.base import Verdict

# -- lean: LEAN_APPEND --
# One event at the stream's next seq, only if the fence token (when given) is the stream's current one
# and the tip (when expected_seq is given) is the expected one. The tip is MAX(seq) through the unique
# (stream_id, seq) index, as scalar subqueries: SQLite answers MAX there with one index seek, while the
# same MAX in a FROM subquery of an INSERT ... SELECT on its own table read every row of the stream
# (2.3 ms at 20,000 events, measured; docs/coalescing.md). A VALUES row, not INSERT ... SELECT: a SELECT
# that reads the table it inserts into is first copied into a temporary table (19 % of the statement's
# instructions, measured); here the guards pick the seq (NULL when one fails) and OR IGNORE skips a row
# that breaks a constraint, so a refused append writes nothing and raises nothing (the seq's NOT NULL; a
# unique or CHECK violation cannot happen under the write lock with our JSON, and would be skipped the
# same way: the transactional path then meets it and raises it). No lock clause: an autocommit
# statement holds SQLite's write lock from its first read to its commit. RETURNING: the seq written (no
# row: refused, nothing written).
LEAN_APPEND = """
INSERT OR IGNORE INTO journal_event (stream_id, seq, type, payload, recorded_at)
VALUES (?1, CASE WHEN (?5 IS NULL OR EXISTS (SELECT 1 FROM journal_fence f WHERE f.stream_id = ?1 AND f.token = ?5))
                  AND (?6 IS NULL OR COALESCE((SELECT MAX(e.seq) FROM journal_event e WHERE e.stream_id = ?1), -1) = ?6)
             THEN COALESCE((SELECT MAX(e.seq) FROM journal_event e WHERE e.stream_id = ?1), -1) + 1 END,
        ?2, ?3, ?4)
RETURNING seq
"""

# -- lean: LEAN_APPEND_AT --
# LEAN_APPEND where the tip is known before the statement: the caller's expected_seq, or the seq this
# process last wrote to the stream (`_tips`). The same guards and the same row (seq = tip + 1 only if
# MAX(seq) is that tip now, under the write lock), without RETURNING: the seq is known, and the row
# count says whether it was written. RETURNING and its fetch were 27 % of LEAN_APPEND's instructions
# (callgrind, 4,000 statements: 90.5k per statement, 66.4k here, the minimal statement 62.0k). A tip
# remembered wrongly (another writer, a removed stream) only fails the guard: LEAN_APPEND then reads it.
LEAN_APPEND_AT = """
INSERT OR IGNORE INTO journal_event (stream_id, seq, type, payload, recorded_at)
VALUES (?1, CASE WHEN (?5 IS NULL OR EXISTS (SELECT 1 FROM journal_fence f WHERE f.stream_id = ?1 AND f.token = ?5))
                  AND COALESCE((SELECT MAX(e.seq) FROM journal_event e WHERE e.stream_id = ?1), -1) = ?6
             THEN ?6 + 1 END,
        ?2, ?3, ?4)
"""

_tips: dict[tuple[str, str], int] = {}
"""(alias, stream) -> the seq this process last wrote there with a lean statement: a guess LEAN_APPEND_AT
checks under the write lock, never trusted. Emptied when it reaches TIPS_KEPT entries (a writer of many
streams then reads their tips again with LEAN_APPEND: correct either way)."""
TIPS_KEPT = 4096


def lean_applies(connection, items) -> bool:
    """Whether the lean statement may write `items`: one stream, one event, a caller in autocommit,
    no query log and no execute wrapper on the connection."""
    return (len(items) == 1 and len(items[0].envelopes) == 1 and unobserved(connection)
            and connection.get_autocommit())


def unobserved(connection) -> bool:
    """No atomic block encloses the caller and nothing observes the connection's statements (query log,
    execute wrappers): the part of `lean_applies` decided without connecting. The cheapest tests first."""
    return not (connection.in_atomic_block or connection.execute_wrappers or connection.queries_logged)


def lean_append(connection, item: AppendItem, text: str) -> Verdict | None:
    """Write `item`'s one event with LEAN_APPEND_AT (the tip known) or LEAN_APPEND, for a caller `unobserved`
    found outside any atomic block; its verdict, or None if no statement ran (autocommit is off: a manual
    transaction) or none wrote (a guard refused it at that moment): the caller then takes the transactional
    path, which reads the guards again and gives the verdicts."""
    connection.validate_thread_sharing()  # as Django's cursor(): a connection of another thread is refused
    connection.ensure_connection()  # connects if closed, and refuses an async context (async_unsafe)
    if not connection.autocommit:
        return None
    sid, token, expected = item.stream_id, item.fence_token, item.expected_seq
    key = (connection.alias, sid)
    tip = _tips.get(key) if expected is None else expected
    row = (sid, item.envelopes[0].type, text, stamp(connection), token)
    raw = connection.connection
    try:
        if tip is not None and raw.execute(LEAN_APPEND_AT, (*row, tip)).rowcount == 1:
            written = tip + 1
        elif expected is not None:  # the caller's tip is not the stream's (or the fence refused)
            written = None
        else:  # no tip remembered, or a wrong one: read it
            rows = raw.execute(LEAN_APPEND, (*row, None)).fetchall()
            written = rows[0][0] if rows else None
    except Exception:
        # Translated as through a Django cursor (IntegrityError, OperationalError "database is locked"...):
        # the wrapper's exit maps the driver's exception; entered only on failure (free on success).
        with connection.wrap_database_errors:
            raise
    if written is None:
        _tips.pop(key, None)
        return None
    if len(_tips) >= TIPS_KEPT:
        _tips.clear()
    _tips[key] = written
    return Verdict(sid, written - 1, True, expected)


def stamp(connection) -> str:
    """The current time as Django's SQLite backend stores it in a datetime column (`recorded_at`): the
    text of `connection.ops.adapt_datetimefield_value(timezone.now())`. With USE_TZ and the database's
    TIME_ZONE unset (`connection.timezone` is UTC, reset by Django when either setting changes) that is the
    naive UTC time's `str()`, made here from the clock `datetime.now` reads (floored to the microsecond,
    as it is) and the text of the current second, made once per second: 0.56 us against Django's 2.7 (its
    two settings lookups) and half of `datetime.now(UTC)...isoformat(" ")`."""
    if connection.timezone is not UTC:
        return connection.ops.adapt_datetimefield_value(timezone.now())
    second, micro = divmod(time_ns() // 1000, 1_000_000)
    shown = _second
    if shown[0] != second:  # a tuple replaced whole: another thread reads the old pair or the new one
        shown = _remember(second)
    return f"{shown[1]}.{micro:06d}" if micro else shown[1]  # str(datetime) leaves out a zero microsecond


_second: tuple[int, str] = (-1, "")
"""The last second `stamp` wrote, and its text ("YYYY-MM-DD HH:MM:SS", UTC)."""


def _remember(second: int) -> tuple[int, str]:
    """Make and keep the text of a new second (once a second: strftime-like formatting is most of a stamp)."""
    global _second
    _second = (second, str(datetime.fromtimestamp(second, UTC).replace(tzinfo=None)))
    return _second
