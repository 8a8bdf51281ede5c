"""The statements flows add to the journal's: the Execution header written WITH the log.

Why here and not in journal/store: the header is a flows concept, but keeping it in step with the
log must not cost extra round trips on the hot path. On PostgreSQL each single-execution statement
below is the journal's own guarded statement (journal/store/postgres.py OPEN / APPEND, through its
public extension point `render(template, notify, ctes)`, so the fence and sequence guards are
exactly the journal's) plus one more CTE that writes the header. Data-modifying CTEs always run to
completion, so the header write happens in the same statement and the same commit as the events:
a reader never sees a settled log with a running header, or a header without its log.

The `*_MANY` statements are the coalesced forms (journal/coalesce.py kinds registered by
journal/flows/writer.py): the bootstraps or settles of many executions in ONE statement and one
notifying commit. On SQLite the single forms run as plain statements inside one IMMEDIATE
transaction (no network round trip to save there, so nothing is coalesced).
"""

from __future__ import annotations

from functools import lru_cache

from journal.flows.ownership import Companion
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

# -- boot_many (PostgreSQL, coalesced bootstraps of many executions) --
# Per execution the same rule as OPEN: the fence row (token 1) decides who starts. The fences go
# in with ON CONFLICT DO NOTHING RETURNING, so an id that already has a fence (or a racing start
# that commits first: the insert waits for it, then skips) simply does not come back; the events
# and the header rows are inserted FROM that RETURNING, i.e. for exactly the executions that won.
# A loser therefore writes nothing and the winners start in the same statement: there is nothing
# to retry. The fences are inserted in stream_id order, so two batches racing on overlapping ids
# wait on each other's index entries in the same order and cannot deadlock. An id with events but
# no fence (an aggregate stream) fails the unique (stream_id, seq) index for the whole statement;
# the writer names that stream from the error and writes the others again without it. One
# notification for every stream the statement wrote. Returns the ids that started.
BOOT_MANY = """
WITH req AS (
    SELECT * FROM unnest(%(sids)s::text[], %(flows)s::text[], %(statuses)s::text[], %(inputs)s::jsonb[],
                         %(results)s::jsonb[], %(errors)s::text[], %(finished)s::boolean[])
        AS q(stream_id, flow, status, input, result, error, finished)
), fence AS (
    INSERT INTO journal_fence (stream_id, token, created_at)
    SELECT q.stream_id, 1, now() FROM req q ORDER BY q.stream_id
    ON CONFLICT (stream_id) DO NOTHING
    RETURNING stream_id
), ins AS (
    INSERT INTO journal_event (stream_id, seq, type, payload, recorded_at)
    SELECT r.stream_id, r.ord, r.type, r.payload, now()
    FROM unnest(%(rsids)s::text[], %(ords)s::int[], %(types)s::text[], %(payloads)s::jsonb[])
        AS r(stream_id, ord, type, payload)
    JOIN fence f ON f.stream_id = r.stream_id
    ORDER BY r.stream_id, r.ord
    RETURNING stream_id, seq, type
), hdr AS (
    -- The header exists iff its execution won the fence (as in the single bootstrap).
    INSERT INTO journal_execution (id, flow, status, input, result, error, recoveries,
                                   created_at, updated_at, finished_at)
    SELECT q.stream_id, q.flow, q.status, q.input, q.result, q.error, 0,
           now(), now(), CASE WHEN q.finished THEN now() END
    FROM req q JOIN fence f ON f.stream_id = q.stream_id
    ON CONFLICT (id) DO NOTHING
)%(ctes)s%(notify)s
SELECT f.stream_id%(notified)s FROM fence f
"""
BOOT_MANY_NOTIFY, BOOT_MANY_SILENT = pg.render(BOOT_MANY, True), pg.render(BOOT_MANY, False)

# -- header_settle_many (PostgreSQL, inside the journal's guarded multi-stream APPEND) --
# The journal's APPEND is all or nothing across its streams: if any stream fails its fence or
# sequence guard, `ins` is empty. The headers are updated only for streams whose rows `ins`
# inserted, so a refused batch touches no header (a new owner after a takeover keeps its own),
# and the writer retries the others without the refused stream. Two settles never hold the same
# execution (one fence holder at a time; a stale one inserts nothing, so updates nothing), so the
# row locks of concurrent batches do not overlap and their order does not matter.
_HEADER_SETTLE_MANY_CTE = """
, hdr AS (
    UPDATE journal_execution h SET status = u.status, result = u.result, error = u.error,
        updated_at = now(), finished_at = now()
    FROM unnest(%(hids)s::text[], %(hstatuses)s::text[], %(hresults)s::jsonb[], %(herrors)s::text[])
        AS u(id, status, result, error)
    WHERE h.id = u.id AND u.id IN (SELECT stream_id FROM ins)
)"""
SETTLE_MANY_NOTIFY = pg.render(pg.APPEND, True, _HEADER_SETTLE_MANY_CTE)
SETTLE_MANY_SILENT = pg.render(pg.APPEND, False, _HEADER_SETTLE_MANY_CTE)



# -- companions: the same four statements with an ownership's CTEs added (journal/flows/ownership.py
# Companion; the leases app writes and deletes the lease row there). Each variant is built once per
# companion and notify flag, so its text is constant and psycopg prepares it once per connection.
@lru_cache(maxsize=32)
def boot(companion: Companion | None, notify: bool) -> str:
    return pg.render(pg.OPEN, notify, _HEADER_INSERT_CTE + (companion.boot if companion else ""))


@lru_cache(maxsize=32)
def boot_many(companion: Companion | None, notify: bool) -> str:
    return pg.render(BOOT_MANY, notify, companion.boot_many if companion else "")


@lru_cache(maxsize=32)
def settle(companion: Companion | None, notify: bool) -> str:
    return pg.render(pg.APPEND, notify, _HEADER_SETTLE_CTE + (companion.settle if companion else ""))


@lru_cache(maxsize=32)
def settle_many(companion: Companion | None, notify: bool) -> str:
    return pg.render(pg.APPEND, notify, _HEADER_SETTLE_MANY_CTE + (companion.settle_many if companion else ""))


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
