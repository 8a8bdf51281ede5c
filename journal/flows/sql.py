"""The statements flows add to the journal's: the Execution header written WITH the log.

Why here and not in journal/store: the header is a flows concept, but keeping it in step with the
log must not cost extra round trips on the hot path. On PostgreSQL each statement below is the
journal's own guarded statement (journal/store/postgres.py OPEN / APPEND, reused verbatim so the
fence and sequence guards are exactly the journal's) plus one more CTE that writes the header.
Data-modifying CTEs always run to completion, so the header write happens in the same statement
and the same commit as the events: a reader never sees a settled log with a running header, or
a header without its log. On SQLite the same pairs run inside one IMMEDIATE transaction (no
network round trip to save there, so plain statements are used).
"""

from __future__ import annotations

from journal.store import postgres as pg

# -- header_insert (PostgreSQL, inside the bootstrap) --
# The header row is inserted FROM the fence CTE: it exists iff this start won the sequence-0
# bootstrap. A refused start (the fence row already existed) inserts no header, and two racing
# starts cannot both insert one.
_HEADER_INSERT_CTE = """
, hdr AS (
    INSERT INTO journal_execution (id, flow, status, input, result, error, recoveries,
                                   created_at, updated_at, finished_at)
    SELECT f.stream_id, %(flow)s, %(status)s, %(input)s::jsonb, %(result)s::jsonb, %(error)s, 0,
           now(), now(), CASE WHEN %(finished)s THEN now() END
    FROM fence f
    ON CONFLICT (id) DO NOTHING
)"""

# -- header_settle (PostgreSQL, inside a guarded append) --
# Settle the header only if the settling events were inserted: an append refused by the fence
# (a resume or cancel took over) must not touch the header the new owner keeps.
_HEADER_SETTLE_CTE = """
, hdr AS (
    UPDATE journal_execution SET status = %(status)s, result = %(result)s::jsonb, error = %(error)s,
        updated_at = now(), finished_at = now()
    WHERE id = %(hid)s AND EXISTS (SELECT 1 FROM ins)
)"""

_ANCHOR = "\n)%(notify)s"


def _with_header(template: str, cte: str) -> str:
    if template.count(_ANCHOR) != 1:  # the journal's statement changed shape: fail at import, not at run
        raise RuntimeError("journal/store/postgres.py statement no longer ends its CTEs with ')%(notify)s'")
    return template.replace(_ANCHOR, "\n)" + cte + "%(notify)s")


BOOT = _with_header(pg.OPEN, _HEADER_INSERT_CTE)
BOOT_NOTIFY, BOOT_SILENT = pg._render(BOOT, True), pg._render(BOOT, False)
SETTLE = _with_header(pg.APPEND, _HEADER_SETTLE_CTE)
SETTLE_NOTIFY, SETTLE_SILENT = pg._render(SETTLE, True), pg._render(SETTLE, False)

# -- SQLite: the same two header writes, run in the transaction of the journal write --
SQLITE_HEADER_INSERT = """
INSERT INTO journal_execution (id, flow, status, input, result, error, recoveries, created_at, updated_at,
                               finished_at)
VALUES (%s, %s, %s, %s, %s, %s, 0, %s, %s, %s)
"""
SQLITE_HEADER_SETTLE = """
UPDATE journal_execution SET status = %s, result = %s, error = %s, updated_at = %s, finished_at = %s WHERE id = %s
"""

# -- header_status: the error path of a refused start (says where the execution stands) --
HEADER_STATUS = "SELECT status, flow, result, error FROM journal_execution WHERE id = %s"
