"""The journal on PostgreSQL: every statement it runs, named, and the reasons for each guard.

Appends are ONE statement each, in autocommit (or a savepoint inside a caller's transaction), so
a batch is all-or-nothing by construction: the guard and the inserts either all commit or none.
Parameters travel as arrays through `unnest`, so the statement text is the same for any batch
size and psycopg prepares it once per connection.
"""

from __future__ import annotations

import json
import re
import weakref
from collections.abc import Callable, Sequence
from functools import lru_cache

import psycopg
from django.db.backends.utils import CursorDebugWrapper
from django.utils import timezone
from psycopg.pq import TransactionStatus

from journal import conf, jsonvalues
from journal.atomic import atomic
from journal.envelopes import AppendItem, SnapshotRecord, StoredEvent
from journal.privacy import codec
from journal.store.base import (
    SETTLED_STATUSES,
    ClaimedWait,
    ExecutionBoot,
    ExecutionSettle,
    JournalStore,
    Verdict,
    flow_keys,
)

# -- notify --
# One notification per statement, carrying the new tip of every stream it wrote and the distinct
# event types it wrote (so that listeners can skip work no reaction cares about):
#   {"tips": {"<stream_id>": <last seq>, ...}, "types": ["<type>", ...]}
# NOTIFY payloads are limited to 8000 bytes; a larger one is replaced by {"poll": true}, telling
# listeners that something changed and they must poll. A notifying commit serialises commits
# (PostgreSQL takes a global lock on the notify queue at commit), so batching amortises it.
NOTIFY_CTE = """
, note AS (
    SELECT pg_notify(%(channel)s, CASE WHEN octet_length(p) <= 7999 THEN p ELSE '{"poll":true}' END)
    FROM (SELECT json_build_object(
              'tips', (SELECT json_object_agg(stream_id, tip)
                       FROM (SELECT stream_id, max(seq) AS tip FROM ins GROUP BY stream_id) t),
              'types', (SELECT json_agg(DISTINCT type) FROM ins))::text AS p
          WHERE EXISTS (SELECT 1 FROM ins)) x
)"""

# -- append --
# The guarded append of one or many streams. Per stream: the fence guard (token given => it must
# be the fence row's current token) and the sequence guard (expected given => the tip must be
# exactly there). Rows get seq = tip + 1 + ord. If ANY stream fails its guard, NOTHING is
# inserted; the verdicts say who failed. Two concurrent writers that pass the guard on the same
# tip collide on the unique (stream_id, seq) index: the second gets a unique violation, which the
# store turns into SequenceConflict, and its whole statement is rolled back.
APPEND = """
WITH streams AS (
    SELECT * FROM unnest(%(sids)s::text[], %(tokens)s::bigint[], %(expected)s::bigint[])
        AS s(stream_id, token, expected)
), rows AS (
    SELECT * FROM unnest(%(rsids)s::text[], %(ords)s::int[], %(types)s::text[], %(payloads)s::jsonb[])
        AS r(stream_id, ord, type, payload)
), fenced AS (
    -- FOR KEY SHARE on the fence row: a takeover locks it FOR UPDATE, so it waits until this
    -- statement commits, and a takeover that committed first makes this read re-check the row and
    -- see the new token (no match: refused). An append that passed the fence therefore always
    -- commits before the takeover's reads begin. KEY SHARE locks do not block each other, so
    -- many appends to fenced streams never queue behind one another.
    SELECT f.stream_id FROM journal_fence f
    JOIN streams s ON s.stream_id = f.stream_id AND f.token = s.token
    FOR KEY SHARE OF f
), verdict AS MATERIALIZED (
    SELECT s.stream_id, s.expected, s.token,
        -- The tip is one backward probe of the unique (stream_id, seq) index.
        COALESCE((SELECT e.seq FROM journal_event e WHERE e.stream_id = s.stream_id
                  ORDER BY e.seq DESC LIMIT 1), -1) AS tip,
        (s.token IS NULL OR s.stream_id IN (SELECT stream_id FROM fenced)) AS fence_ok
    FROM streams s
), ins AS (
    INSERT INTO journal_event (stream_id, seq, type, payload, recorded_at)
    SELECT r.stream_id, v.tip + 1 + r.ord, r.type, r.payload, now()
    FROM rows r JOIN verdict v ON v.stream_id = r.stream_id
    -- all or nothing: one failed guard stops every row.
    WHERE NOT EXISTS (SELECT 1 FROM verdict x
                      WHERE NOT (x.fence_ok AND (x.expected IS NULL OR x.expected = x.tip)))
    -- A fixed insertion order: two batches touching the same streams wait on each other's index
    -- entries in the same order, so they cannot deadlock.
    ORDER BY r.stream_id, r.ord
    RETURNING stream_id, seq, type
)%(ctes)s%(notify)s
SELECT v.stream_id, v.tip, v.fence_ok, v.expected%(notified)s FROM verdict v
"""

# -- bench: MINIMAL_APPEND --
# Benchmarks only (the `append` section's `minimal` row, the floor our APPEND is measured against):
# the least a fenced, notified one-event append can be, in ONE statement. The fence row read FOR KEY
# SHARE (the same lock as APPEND, for the same reason: a takeover's FOR UPDATE waits for it), one
# INSERT at a seq the writer tracks itself (the unique (stream_id, seq) index is its sequence
# guard), one pg_notify. No verdicts, no tip probe: a refused row simply inserts nothing.
MINIMAL_APPEND = """
WITH f AS (
    SELECT stream_id FROM journal_fence WHERE stream_id = %(sid)s AND token = %(token)s FOR KEY SHARE
), ins AS (
    INSERT INTO journal_event (stream_id, seq, type, payload, recorded_at)
    SELECT f.stream_id, %(seq)s, %(type)s, %(payload)s::jsonb, now() FROM f
    RETURNING seq
)
SELECT pg_notify(%(channel)s, %(sid)s || ':' || seq) FROM ins
"""

# -- open_stream --
# Sequence-0 bootstrap of a single-writer stream: the fence row (token 1) and the first events
# in one statement. ON CONFLICT DO NOTHING on the fence waits for a racing opener's commit and
# then inserts nothing, so exactly one of two racing opens writes anything; an existing seq 0
# without a fence (an aggregate stream) fails on the unique index instead.
OPEN = """
WITH fence AS (
    INSERT INTO journal_fence (stream_id, token, created_at) VALUES (%(sid)s, 1, now())
    ON CONFLICT (stream_id) DO NOTHING
    RETURNING stream_id
), ins AS (
    INSERT INTO journal_event (stream_id, seq, type, payload, recorded_at)
    SELECT f.stream_id, r.ord, r.type, r.payload, now()
    FROM fence f, unnest(%(ords)s::int[], %(types)s::text[], %(payloads)s::jsonb[]) AS r(ord, type, payload)
    ORDER BY r.ord
    RETURNING stream_id, seq, type
)%(ctes)s%(notify)s
SELECT (SELECT count(*) FROM ins)%(notified)s
"""

# -- advance_fences --
# THE fence advance, of one stream (Fence.objects.advance, resume; an expected token optional) or of
# many (the leases sweep: takeover and give-up, expected NULL). Lock the fence rows FOR UPDATE (waits
# for in-flight fenced appends, which hold KEY SHARE; a concurrent advance that committed first makes
# the expected-token test re-check the new token), in stream order so that two advancers of
# overlapping sets queue instead of deadlocking, then bump. From this commit on, appends with an
# older token are refused.
ADVANCE_FENCES = """
UPDATE journal_fence f SET token = f.token + 1 FROM (
    SELECT stream_id FROM journal_fence WHERE stream_id = ANY(%(sids)s::text[])
        AND (%(expected)s::bigint IS NULL OR token = %(expected)s::bigint)
    ORDER BY stream_id FOR UPDATE
) c WHERE f.stream_id = c.stream_id
RETURNING f.stream_id, f.token
"""

# -- lock_stream --
# A transaction-scoped advisory lock on one stream, taken by aggregates' retries (do_with_retry after
# a lost race) so that the losers queue in arrival order instead of racing each other again; released
# at commit or rollback. The two-int key form (a class id for "stream", the stream's hash) is a key
# space of its own, apart from the single-bigint locks of projections; two streams sharing a hash only
# queue a little more. Plain appends never take it: correctness stays with the expected-seq guard.
LOCK_STREAM = "SELECT pg_advisory_xact_lock(%s, hashtext(%s))"
LOCK_STREAM_CLASS = 0x4C6F6F6D  # "Loom"

# -- save_snapshot --
# Idempotent: two writers checkpointing the same seq store one row.
SAVE_SNAPSHOT = """
INSERT INTO journal_snapshot (stream_id, seq, state, created_at) VALUES (%s, %s, %s::jsonb, now())
ON CONFLICT (stream_id, seq) DO NOTHING
"""

# == executions (flows): the header row written WITH the log ==========================================
# Each statement below is the journal's own guarded statement (OPEN or APPEND above, so the fence and
# sequence guards are exactly the journal's) plus a CTE that writes the Execution header. Data-
# modifying CTEs always run to completion, so the header is written in the same statement and the
# same commit as the events. `%(ctes)s` stays open for an ownership's companion (journal/flows/
# ownership.py Companion: the leases app writes and deletes its lease row there, see
# leases/store/postgres.py LEASE_*_CTE); `executions_sql` fills it in. The *_MANY statements are the
# coalesced forms (the flows kinds of journal/coalesce.py): many executions in ONE statement and one
# notifying commit.

# -- boot --
# OPEN plus the header row, inserted FROM the fence CTE: it exists iff this start won the sequence-0
# bootstrap. A refused start (the fence row already existed) inserts no header, and two racing
# starts cannot both insert one.
BOOT = OPEN.replace("%(ctes)s", """
, hdr AS (
    INSERT INTO journal_execution (id, flow, flow_version, status, input, result, error, recoveries,
                                   created_at, updated_at, finished_at)
    SELECT f.stream_id, %(flow)s, %(version)s, %(status)s, %(input)s::jsonb, %(result)s::jsonb, %(error)s, 0,
           now(), now(), CASE WHEN %(finished)s THEN now() END
    FROM fence f
    ON CONFLICT (id) DO NOTHING
)%(ctes)s""")

# -- settle --
# APPEND plus the header update, only if the settling events were inserted: an append refused by the
# fence (a resume or cancel took over) must not touch the header the new owner keeps.
SETTLE = APPEND.replace("%(ctes)s", """
, hdr AS (
    UPDATE journal_execution SET status = %(status)s, result = %(result)s::jsonb, error = %(error)s,
        updated_at = now(), finished_at = now()
    WHERE id = %(hid)s AND EXISTS (SELECT 1 FROM ins)
)%(ctes)s""")

# -- boot_many --
# Per execution the same rule as OPEN: the fence row (token 1) decides who starts. The fences go
# in with ON CONFLICT DO NOTHING RETURNING, so an id that already has a fence (or a racing start
# that commits first: the insert waits for it, then skips) simply does not come back; the events
# and the header rows are inserted FROM that RETURNING, i.e. for exactly the executions that won.
# A loser therefore writes nothing and the winners start in the same statement: there is nothing
# to retry. The fences are inserted in stream_id order, so two batches racing on overlapping ids
# wait on each other's index entries in the same order and cannot deadlock. An id with events but
# no fence (an aggregate stream) fails the unique (stream_id, seq) index for the whole statement;
# the store names that stream from the error and the coalescer writes the others again without it.
# One notification for every stream the statement wrote. Returns the ids that started.
BOOT_MANY = """
WITH req AS (
    SELECT * FROM unnest(%(sids)s::text[], %(flows)s::text[], %(statuses)s::text[], %(inputs)s::jsonb[],
                         %(results)s::jsonb[], %(errors)s::text[], %(finished)s::boolean[], %(versions)s::int[])
        AS q(stream_id, flow, status, input, result, error, finished, version)
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
    -- The header exists iff its execution won the fence (as in BOOT).
    INSERT INTO journal_execution (id, flow, flow_version, status, input, result, error, recoveries,
                                   created_at, updated_at, finished_at)
    SELECT q.stream_id, q.flow, q.version, q.status, q.input, q.result, q.error, 0,
           now(), now(), CASE WHEN q.finished THEN now() END
    FROM req q JOIN fence f ON f.stream_id = q.stream_id
    ON CONFLICT (id) DO NOTHING
)%(ctes)s%(notify)s
SELECT f.stream_id%(notified)s FROM fence f
"""

# -- settle_many --
# APPEND (all or nothing across its streams: if any stream fails its fence or sequence guard, `ins`
# is empty) plus the headers, updated only for streams whose rows `ins` inserted, so a refused batch
# touches no header (a new owner after a takeover keeps its own) and the coalescer retries the others
# without the refused stream. Two settles never hold the same execution (one fence holder at a time;
# a stale one inserts nothing, so updates nothing), so the row locks of concurrent batches do not
# overlap and their order does not matter.
SETTLE_MANY = APPEND.replace("%(ctes)s", """
, hdr AS (
    UPDATE journal_execution h SET status = u.status, result = u.result, error = u.error,
        updated_at = now(), finished_at = now()
    FROM unnest(%(hids)s::text[], %(hstatuses)s::text[], %(hresults)s::jsonb[], %(herrors)s::text[])
        AS u(id, status, result, error)
    WHERE h.id = u.id AND u.id IN (SELECT stream_id FROM ins)
)%(ctes)s""")


def render(template: str, notify: bool, ctes: str = "") -> str:
    """The executable text of a statement template: with or without the notification, plus `ctes`.

    The extension point for statements composed on the journal's (journal/flows adds the
    execution header): APPEND and OPEN end their CTE list with `%(ctes)s`, where more CTEs
    (each starting with ", name AS (") may read `ins`, the rows the statement inserted. Data-
    modifying CTEs always run to completion, so they commit or roll back with the events. A
    template of its own may also use `%(notify)s` / `%(notified)s` after a CTE named `ins`.
    """
    return template.replace("%(ctes)s", ctes).replace("%(notify)s", NOTIFY_CTE if notify else "").replace(
        "%(notified)s", ", (SELECT count(*) FROM note)" if notify else ""
    )


APPEND_NOTIFY, APPEND_SILENT = render(APPEND, True), render(APPEND, False)

_ARRAY_PARAM = re.compile(r"%\((\w+)\)s(?=::\w+\[\])")


def binary_arrays(sql: str) -> str:
    """The statement with its array parameters (`%(name)s::type[]`) sent in binary (`%(name)b`).

    psycopg writes a list parameter in text as an array literal, quoting and escaping every element in
    Python (a regular expression per JSON payload); in binary it writes each element's length and bytes.
    For a coalesced APPEND of 64 one-event streams that was 7-9 us of the flush thread's time per row in
    text against 2 us in binary (issue 33, docs/coalescing.md), time held under the GIL the callers need.
    The values and the casts are unchanged, so is what is stored. Only where the statement is bound on the
    server (execute_prepared): a client-side binding cursor cannot send binary parameters.
    """
    return _ARRAY_PARAM.sub(r"%(\1)b", sql)


_BINARY = {sql: binary_arrays(sql) for sql in (APPEND_NOTIFY, APPEND_SILENT)}


@lru_cache(maxsize=64)
def binary_many(sql: str) -> str:
    """BOOT_MANY / SETTLE_MANY (with their companions' CTEs) with binary array parameters: a coalesced
    durable batch carries a JSON input, result or payload per execution, quoted in Python in text
    (binary_arrays says why that costs the flush thread). Cached per executable text like executions_sql."""
    return binary_arrays(sql)
OPEN_NOTIFY, OPEN_SILENT = render(OPEN, True), render(OPEN, False)


@lru_cache(maxsize=64)
def executions_sql(template: str, companion_ctes: str, notify: bool) -> str:
    """The executable text of BOOT, BOOT_MANY, SETTLE or SETTLE_MANY with a companion's CTEs (or "").
    Built once per combination, so the text is constant and psycopg prepares it once per connection."""
    return render(template, notify, companion_ctes)

# == for other apps: fences, executions recovery, event reads ==========================================
# (journal/store/base.py has the statements both backends share, and the methods.)

# -- hook: CURRENT_FENCE_JOIN --
# For a statement of another app that must only act on an execution at its CURRENT fence token, in
# the same statement (leases' ACQUIRE: a run whose fence was already advanced never gets a lease).
# A JOIN clause; format {eid} and {token} with the caller's column expressions. It takes no lock: the
# caller's row lock (ON CONFLICT) and the fence advance's FOR UPDATE order the two.
CURRENT_FENCE_JOIN = "JOIN journal_fence f ON f.stream_id = {eid} AND f.token = {token}"

# -- hook: STREAM_TIP_SQL --
# The last seq of one stream (NULL if it has none) as a subquery yielding one column `tip`: one
# backward probe of the (stream_id, seq) unique index. Format {stream} with the caller's column
# expression (projections' BUMP_HINTED clamps a notified tip to it in its own upsert).
STREAM_TIP_SQL = "SELECT max(j.seq) AS tip FROM journal_event j WHERE j.stream_id = {stream}"

# -- hook: EXECUTION_EXISTS --
# True when execution {eid} has a header, for another app's statement that must act only on executions
# that began, in the same statement (leases' PRUNE_RESERVATIONS). Format {eid} with the caller's column
# expression. No lock: a header, once written, is never deleted while a reservation can name it.
EXECUTION_EXISTS = "EXISTS (SELECT 1 FROM journal_execution e WHERE e.id = {eid})"

# -- hook: RECOVERY_CANDIDATES --
# The running executions a recovery sweep may take over, in id order, of the flows asked for
# (%(any_flow)s, %(flows)s text[]), at most %(limit)s. Two index-driven arms, so that the cost follows
# the lapsed executions, not the running ones (docs/benchmarks.md, growth: one join over every running
# execution and every lease grew 3-5x for 10x the executions):
# - {expired}: the leases store's subquery of the ids (one column) whose lease expired (its expires_at index);
# - orphans: running executions last updated more than %(orphan)s seconds ago (journal_exec_running_upd,
#   the partial index of running rows' updated_at: only the old ones are read) for which {unleased},
#   the leases store's test on `o.id`, finds no lease row (a lazy run takes its lease after the grace).
#   A running header's updated_at is the moment it became running (start, retry, wake, takeover):
#   steps and renewals never touch it, so a long run's header stays old, leased or not. %(window)s
#   bounds the read from below: only the headers that passed the grace in the last %(window)s seconds
#   (the common sweep, leases/recovery.py OrphanReach: its cost follows the headers that aged past the
#   grace since the last sweep, not every long run); NULL reads all of them (the full orphan pass, at
#   a worker's start and every LOOM_RECOVERY_FULL_EVERY seconds). COALESCE keeps the bound one
#   expression of the parameters and now(), so even a generic plan (server-side binding) takes it as
#   an index bound.
# The arms are disjoint (a lease row or none) and each yields an id once (primary keys): UNION ALL.
# Each id is then read by primary key and re-checked running (the arms are a snapshot: a run that
# settled since is skipped), then filtered by flow. FOR UPDATE OF e SKIP LOCKED: two sweepers never
# take the same execution, and neither waits for the other; only the header rows are locked.
RECOVERY_CANDIDATES = """
SELECT e.id, e.recoveries, e.flow
FROM (
    SELECT o.id FROM journal_execution o
    WHERE o.status = 'running' AND o.updated_at < now() - %(orphan)s::float8 * interval '1 second'
      AND o.updated_at >= COALESCE(now() - (%(orphan)s::float8 + %(window)s::float8) * interval '1 second',
                                   '-infinity'::timestamptz)
      AND {unleased}
    UNION ALL
    {expired}
) c
JOIN journal_execution e ON e.id = c.id
WHERE e.status = 'running'
  -- Only flows this worker has code for: another worker may run the rest; taking them here would
  -- burn their recovery attempts on UnknownFlow. Of the versions it has, too: an entry of %(flows)s is
  -- a flow name (any version) or the JSON text of [name, version] (version 0: any), as
  -- journal.store.base.flow_keys makes them; an execution resumes only on the version it started on.
  AND (%(any_flow)s OR EXISTS (
      SELECT 1 FROM unnest(%(flows)s::text[]) AS k(key)
      WHERE CASE WHEN left(k.key, 1) = '['
                 THEN k.key::jsonb ->> 0 = e.flow AND (k.key::jsonb ->> 1)::int IN (0, e.flow_version)
                 ELSE k.key = e.flow END))
ORDER BY e.id
LIMIT %(limit)s
FOR UPDATE OF e SKIP LOCKED
"""

# -- mark_recovered --
MARK_RECOVERED = """
UPDATE journal_execution SET recoveries = recoveries + 1, updated_at = now() WHERE id = ANY(%(eids)s::text[])
"""

# -- count_recovery -- one recovery attempt that reached the database (leases/recovery.py resume_one, before the
# flow's code runs), only while the fence is still the taking run's: a takeover that could not reach the database
# since is not an attempt (#35), and a run fenced off meanwhile counts nothing.
COUNT_RECOVERY = """
UPDATE journal_execution SET recoveries = recoveries + 1, updated_at = now()
WHERE id = %(eid)s AND status = 'running'
  AND EXISTS (SELECT 1 FROM journal_fence f WHERE f.stream_id = %(eid)s AND f.token = %(token)s)
"""

# -- mark_stuck --
# Too many recoveries: visible in the admin; the leases sweep fences it off and drops its lease.
MARK_STUCK = """
UPDATE journal_execution SET status = 'stuck', updated_at = now(),
    error = 'recovery gave up after ' || recoveries || ' attempts (LOOM_RECOVERY_MAX_ATTEMPTS)'
WHERE id = ANY(%(eids)s::text[])
"""

# -- mark_stuck: wake_stuck_parents -- the child waits on them due now (the wait row's own lock only).
WAKE_STUCK_PARENTS = """
UPDATE journal_wait SET due_at = now()
WHERE kind = 'child' AND child = ANY(%(eids)s::text[]) AND (due_at IS NULL OR due_at > now())
"""

# -- read_after --
# Each (stream, seq) pair from ITS OWN watermark: one LATERAL probe of the (stream_id, seq) unique index
# per pair, all in one round trip; each probe stops after `batch` rows (projections' READ, issue 11).
READ_AFTER = """
SELECT c.at, e.id, e.stream_id, e.seq, e.type, e.payload, e.recorded_at
FROM unnest(%(streams)s::text[], %(ats)s::bigint[]) AS c(stream_id, at)
CROSS JOIN LATERAL (
    SELECT id, stream_id, seq, type, payload, recorded_at FROM journal_event j
    WHERE j.stream_id = c.stream_id AND j.seq > c.at ORDER BY j.seq LIMIT %(batch)s
) e
ORDER BY e.stream_id, c.at, e.seq
"""


# -- read_sealed -- (only when journal/privacy is in use: codec.active())
# A stream's events AND, beside each, the key row of the data subject its "$sealed" header names first
# ([[path, subject], ...]): a load of sealed events costs no round trip more than a plain one. The key row
# comes from a LATERAL probe of journal_datakey's subject index per event, in the read's own index order:
# no CTE holding the payloads and no sort of them (the earlier form, the events UNION the subjects' rows
# ordered after, cost about 0.2 ms more server time per 100-event read, docs/privacy.md "Cost"). LATERAL
# with LIMIT 1, not a plain LEFT JOIN: the planner cannot turn it into a hash join, which on a stream it
# overestimates seq-scans the whole key table for every read. A plain payload has no header: a NULL probe,
# no key read. The subject column is the key row's (NULL: no row); any other subject of a header (a second
# one in the same event, or one with no row) is looked up by the codec in one more statement for the whole
# read (keys.for_read), never taken for forgotten.
READ_SEALED = """
SELECT e.id, e.stream_id, e.seq, e.type, e.payload, e.recorded_at, k.subject, k.master_id, k.wrapped
FROM journal_event e
LEFT JOIN LATERAL (
    SELECT subject, master_id, wrapped FROM journal_datakey WHERE subject = e.payload->'$sealed'->0->>1 LIMIT 1
) k ON true
WHERE e.stream_id = %(stream)s AND e.seq > %(after)s ORDER BY e.seq LIMIT %(limit)s
"""

# == waits (flows that wait) ===========================================================================
# Every wait statement that must see a message or a settle committed by another transaction runs
# AFTER the header lock (LOCK_HEADER) in its own statement: under READ COMMITTED each statement reads
# a fresh snapshot, so what committed before we got the lock is visible to it.

# -- lock_header --
# FOR UPDATE of one execution header: park, send_message and wake_wait all take it first, so the three
# are ordered per execution (a message sent while the execution parks is seen by the park, or the
# send's wake-up finds the row the park committed). Returns the status (no row: unknown execution).
LOCK_HEADER = "SELECT status FROM journal_execution WHERE id = %(eid)s FOR UPDATE"

# -- park --
# Under the run's fence (FOR KEY SHARE as in APPEND: a takeover's FOR UPDATE waits for us, or we see
# its new token and write nothing): upsert the wait row, due now if what it waits for is already
# there (a pending message of its topic; its child settled), then the header's status. A NOTIFY on
# LOOM_WAIT_CHANNEL carries the due time (epoch seconds) so that wakers sleeping longer wake for it.
PARK = """
WITH fenced AS (
    SELECT stream_id FROM journal_fence WHERE stream_id = %(eid)s AND token = %(token)s FOR KEY SHARE
), ready AS (
    SELECT CASE
        WHEN %(kind)s = 'recv' AND EXISTS (
            SELECT 1 FROM journal_message m
            WHERE m.execution_id = %(eid)s AND m.topic = %(topic)s AND m.consumed_at IS NULL) THEN %(now)s
        WHEN %(kind)s = 'child' AND EXISTS (
            SELECT 1 FROM journal_execution c
            WHERE c.id = %(child)s AND c.status IN ('completed', 'failed', 'cancelled', 'stuck')) THEN %(now)s
        ELSE %(due)s::timestamptz END AS due
), up AS (
    INSERT INTO journal_wait (execution_id, flow, kind, pos, token, due_at, topic, child, created_at)
    SELECT %(eid)s, %(flow)s, %(kind)s, %(pos)s, %(token)s, r.due, %(topic)s, %(child)s, now()
    FROM fenced, ready r
    ON CONFLICT (execution_id) DO UPDATE SET flow = EXCLUDED.flow, kind = EXCLUDED.kind, pos = EXCLUDED.pos,
        token = EXCLUDED.token, due_at = EXCLUDED.due_at, topic = EXCLUDED.topic, child = EXCLUDED.child,
        created_at = EXCLUDED.created_at
    RETURNING due_at
), hdr AS (
    UPDATE journal_execution SET status = %(status)s, updated_at = now()
    WHERE id = %(eid)s AND EXISTS (SELECT 1 FROM up)
), note AS (
    SELECT pg_notify(%(channel)s, extract(epoch FROM due_at)::text) FROM up WHERE due_at IS NOT NULL
)
SELECT due_at, (SELECT count(*) FROM note) FROM up
"""

# -- claim_due_waits: take --
# CLAIM_DUE_ANY (flows None: maintenance and tests, never a worker) reads the timer rows of every flow
# in due order (no index on due_at alone: a sort of them all). FOR UPDATE OF the wait
# row AND its header, SKIP LOCKED: two wakers racing for the same due rows take disjoint ones and
# neither waits, so a due wait wakes ONE run; a row whose header a send, park or wake holds right now
# is skipped (taken by the next round) instead of waited for, so the lock orders cannot cross (they
# take the header first, then the wait row or the fence). The rows are deleted in the same statement
# and commit with the fence advance below.
CLAIM_DUE_ANY = """
WITH due AS (
    SELECT w.execution_id FROM journal_wait w JOIN journal_execution e ON e.id = w.execution_id
    WHERE w.due_at <= %(now)s
    ORDER BY w.due_at
    LIMIT %(limit)s
    FOR UPDATE OF w, e SKIP LOCKED
)
DELETE FROM journal_wait w USING due d WHERE w.execution_id = d.execution_id
RETURNING w.execution_id, w.token, w.flow, w.kind, w.pos
"""

# -- claim_due_waits (of the flows registered here) -- as CLAIM_DUE_ANY, but one range scan of the
# (flow, due_at) index per flow (LATERAL), each stopping after `limit` rows, then the earliest `limit`
# of those: due waits of flows this worker does not have are never read (a filter on the due index
# would read every one of them on every claim). Rows locked by the lateral scans but not among the
# earliest `limit` stay untouched (unlocked at commit). Each flow comes with a version (0: any): only
# executions that started on a version this worker has (the header's flow_version, docs/flows.md
# "Versions"); the others are left, unlocked, to a worker that has theirs.
CLAIM_DUE = """
WITH due AS (
    SELECT c.execution_id FROM unnest(%(flows)s::text[], %(versions)s::int[]) AS f(flow, version)
    CROSS JOIN LATERAL (
        SELECT w.execution_id, w.due_at FROM journal_wait w JOIN journal_execution e ON e.id = w.execution_id
        WHERE w.flow = f.flow AND w.due_at <= %(now)s AND (f.version = 0 OR e.flow_version = f.version)
        ORDER BY w.due_at
        LIMIT %(limit)s
        FOR UPDATE OF w, e SKIP LOCKED
    ) c
    ORDER BY c.due_at
    LIMIT %(limit)s
)
DELETE FROM journal_wait w USING due d WHERE w.execution_id = d.execution_id
RETURNING w.execution_id, w.token, w.flow, w.kind, w.pos
"""

# -- claim_due_waits: fence --
# Each claimed execution's fence advances only from the token it parked under (a takeover since then
# left the row stale: it is deleted above and wakes nothing). FOR UPDATE in stream order, as
# ADVANCE_FENCES: concurrent advancers queue instead of deadlocking.
CLAIM_FENCES = """
UPDATE journal_fence f SET token = f.token + 1 FROM (
    SELECT fe.stream_id FROM journal_fence fe
    JOIN unnest(%(sids)s::text[], %(tokens)s::bigint[]) AS c(sid, token) ON fe.stream_id = c.sid AND fe.token = c.token
    ORDER BY fe.stream_id FOR UPDATE OF fe
) c WHERE f.stream_id = c.stream_id
RETURNING f.stream_id, f.token
"""

# -- claim_due_waits: headers -- running again, updated_at now (the recovery sweep's orphan clock
# starts here: a waker that dies before its run leases the execution is recovered like any orphan).
CLAIM_HEADERS = """
UPDATE journal_execution SET status = 'running', updated_at = now() WHERE id = ANY(%(eids)s::text[])
"""

# -- next_wait_due -- (any flow: maintenance and tests; a sort of all timer rows)
NEXT_DUE = "SELECT due_at FROM journal_wait WHERE due_at IS NOT NULL ORDER BY due_at LIMIT 1"
# ... of the given flows: one probe of the (flow, due_at) index per flow (and version: a wait of a version
# this worker does not have is not its to wake, so it does not shorten its sleep either).
NEXT_DUE_OF = """
SELECT min(n.due_at) FROM unnest(%(flows)s::text[], %(versions)s::int[]) AS f(flow, version) CROSS JOIN LATERAL (
    SELECT w.due_at FROM journal_wait w
    WHERE w.flow = f.flow AND w.due_at IS NOT NULL
      AND (f.version = 0 OR EXISTS (SELECT 1 FROM journal_execution e
                                    WHERE e.id = w.execution_id AND e.flow_version = f.version))
    ORDER BY w.due_at LIMIT 1
) n
"""

# -- carry_messages -- (after LOCK_HEADER of the next run, in the continuing run's settle transaction,
# whose header update holds the old run's header: a send to it waits, then follows the chain) the
# unconsumed messages move to the next run, keeping their ids (order) and message_id (a message_id
# the next run has already is not moved twice); the next run's recv waits on their topics are woken.
CARRY_MESSAGES = """
WITH moved AS (
    UPDATE journal_message m SET execution_id = %(to)s
    WHERE m.execution_id = %(from)s AND m.consumed_at IS NULL
      AND NOT EXISTS (SELECT 1 FROM journal_message n WHERE n.execution_id = %(to)s AND n.message_id = m.message_id)
    RETURNING m.topic
)
SELECT DISTINCT topic FROM moved
"""
# ... and the flow events are copied (the next run's own, if it set one already, win); 'event:<from>'
# is notified (at the settle's commit) so that get_event callers subscribed to the run that continued
# follow the chain now rather than at their next poll (journal/flows/event_listener.py).
CARRY_FLOW_EVENTS = """
WITH copied AS (
    INSERT INTO journal_flowevent (execution_id, key, value, updated_at)
    SELECT %(to)s, key, value, updated_at FROM journal_flowevent WHERE execution_id = %(from)s
    ON CONFLICT (execution_id, key) DO NOTHING
)
SELECT pg_notify(%(channel)s, 'event:' || %(from)s::text)
"""

# -- wake_wait -- (after LOCK_HEADER) due now, only if not due already; notified.
WAKE = """
WITH up AS (
    UPDATE journal_wait SET due_at = %(now)s
    WHERE execution_id = %(eid)s AND (due_at IS NULL OR due_at > %(now)s)
      AND (%(topic)s::text IS NULL OR (kind = 'recv' AND topic = %(topic)s::text))
      AND (%(child)s::text IS NULL OR (kind = 'child' AND child = %(child)s::text))
    RETURNING due_at
), note AS (
    SELECT pg_notify(%(channel)s, extract(epoch FROM due_at)::text) FROM up
)
SELECT count(*), (SELECT count(*) FROM note) FROM up
"""

# -- lock_execution -- (LOCK_HEADER) for a takeover of a parked execution (resume, suspend, cancel):
# header first, then the fence, the same order as park.

# -- drop_wait / wait_of --
DROP_WAIT = "DELETE FROM journal_wait WHERE execution_id = %s"
WAIT_OF = """
SELECT kind, pos, token, due_at, topic, child, flow FROM journal_wait WHERE execution_id = %s
"""

# -- set_execution_status -- only at the current fence: a run fenced off cannot change the header.
SET_STATUS = """
UPDATE journal_execution SET status = %(status)s, updated_at = now()
WHERE id = %(eid)s AND EXISTS (SELECT 1 FROM journal_fence f WHERE f.stream_id = %(eid)s AND f.token = %(token)s)
"""

# -- send_message -- (after LOCK_HEADER) idempotent by (execution_id, message_id): a second send of
# the same id inserts nothing (ON CONFLICT DO NOTHING waits for a racing first send's commit).
SEND = """
INSERT INTO journal_message (execution_id, topic, message_id, payload, sent_at)
VALUES (%(eid)s, %(topic)s, %(mid)s, %(payload)s::jsonb, now())
ON CONFLICT (execution_id, message_id) DO NOTHING
RETURNING id
"""

# -- pending_message -- the oldest unconsumed message of a topic: one probe of journal_message_pending.
PENDING_MESSAGE = """
SELECT id, message_id, payload FROM journal_message
WHERE execution_id = %s AND topic = %s AND consumed_at IS NULL ORDER BY id LIMIT 1
"""

# -- consume_message -- in the recv's journal transaction; the IS NULL guard makes it once only.
CONSUME = "UPDATE journal_message SET consumed_at = %s, consumed_seq = %s WHERE id = %s AND consumed_at IS NULL"

# -- messages_of -- (admin)
MESSAGES_OF = """
SELECT message_id, topic, payload, sent_at, consumed_at FROM journal_message
WHERE execution_id = %s ORDER BY id DESC LIMIT %s
"""

# -- put_flow_event -- upsert, notified ('event:<execution_id>' as payload: that execution's get_event callers re-read).
PUT_FLOW_EVENT = """
WITH up AS (
    INSERT INTO journal_flowevent (execution_id, key, value, updated_at)
    VALUES (%(eid)s, %(key)s, %(value)s::jsonb, now())
    ON CONFLICT (execution_id, key) DO UPDATE SET value = EXCLUDED.value, updated_at = EXCLUDED.updated_at
    RETURNING execution_id
)
SELECT pg_notify(%(channel)s, 'event:' || execution_id) FROM up
"""

# -- flow_event --
FLOW_EVENT = "SELECT value FROM journal_flowevent WHERE execution_id = %s AND key = %s"


class PostgresStore(JournalStore):
    vendor = "postgresql"

    def append_sql(self, notify: bool | None = None) -> str:
        notify = conf.get("LOOM_NOTIFY") if notify is None else notify
        return APPEND_NOTIFY if notify else APPEND_SILENT

    @staticmethod
    def append_params(items: Sequence[AppendItem], encoded: list[list[str]]) -> dict:
        """The array parameters of APPEND (also used by the benchmark's raw-psycopg ceiling)."""
        sids = [i.stream_id for i in items]
        if all(len(texts) == 1 for texts in encoded) and all(len(i.envelopes) == 1 for i in items):
            # One event per stream (the coalesced batches): no row loop.
            return {
                "sids": sids, "tokens": [i.fence_token for i in items], "expected": [i.expected_seq for i in items],
                "rsids": sids, "ords": [0] * len(sids), "types": [i.envelopes[0].type for i in items],
                "payloads": [texts[0] for texts in encoded], "channel": conf.get("LOOM_NOTIFY_CHANNEL"),
            }
        rsids, ords, types, payloads = [], [], [], []
        for item, texts in zip(items, encoded, strict=True):
            for ord_, (env, text) in enumerate(zip(item.envelopes, texts, strict=True)):
                rsids.append(item.stream_id)
                ords.append(ord_)
                types.append(env.type)
                payloads.append(text)
        return {
            "sids": sids,
            "tokens": [i.fence_token for i in items],
            "expected": [i.expected_seq for i in items],
            "rsids": rsids, "ords": ords, "types": types, "payloads": payloads,
            "channel": conf.get("LOOM_NOTIFY_CHANNEL"),
        }

    def _append(self, items, encoded) -> list[Verdict]:
        params = self.append_params(items, encoded)
        sql = self.append_sql()
        with self.guarded(), self.connection.cursor() as cursor:
            execute_prepared(self.connection, cursor, sql, params, binary_sql=_BINARY[sql])
            rows = cursor.fetchall()
        if len(rows) == 1:  # the per-event path: one stream, no lookup table needed
            row = rows[0]
            return [Verdict(row[0], row[1], row[2], row[3])]
        by_stream = {row[0]: Verdict(row[0], row[1], row[2], row[3]) for row in rows}
        return [by_stream[item.stream_id] for item in items]

    def _open(self, item, encoded) -> bool:
        params = {
            "sid": item.stream_id,
            "ords": list(range(len(encoded))),
            "types": [env.type for env in item.envelopes],
            "payloads": encoded,
            "channel": conf.get("LOOM_NOTIFY_CHANNEL"),
        }
        sql = OPEN_NOTIFY if conf.get("LOOM_NOTIFY") else OPEN_SILENT
        with self.guarded(), self.connection.cursor() as cursor:
            execute_prepared(self.connection, cursor, sql, params)
            return cursor.fetchone()[0] > 0

    def advance_fence(self, stream_id: str, expected_token: int | None = None) -> int:
        with self.guarded():
            rows = self._advance_fences([stream_id], expected_token)
        if not rows:
            raise self.fence_refusal(stream_id, expected_token)
        return rows[0][1]

    def execute_guarded(self, sql: str, params, binary_sql: str | None = None) -> list[tuple]:
        """One fixed statement, prepared server-side (see execute_prepared), under `guarded()`."""
        with self.guarded(), self.connection.cursor() as cursor:
            execute_prepared(self.connection, cursor, sql, params, binary_sql=binary_sql)
            return cursor.fetchall() if cursor.description else []

    def prepare_flush_connection(self, lock_timeout_ms: int) -> bool:
        """A flush thread's connection, checked and bounded before each coalesced statement.

        Dropped: a connection the server closed while it sat idle (restart, idle_session_timeout,
        pg_terminate_backend) has the server's farewell and end of stream waiting in its socket;
        reading what is there without waiting (PQconsumeInput, no round trip) finds it, and it is
        replaced before anything is sent, so the batch is written on a fresh one.
        Bounded: the session's lock_timeout (see FLUSH_LOCK_TIMEOUT_MS in journal/coalesce.py), set
        once per connection, outside any transaction, like PLAN_CACHE_MODE. This connection belongs
        to one flush thread and runs only coalesced statements.
        """
        connection = self.connection
        raw = connection.connection
        reconnected = False
        if raw is not None:
            if not raw.closed:
                try:
                    raw.pgconn.consume_input()  # what has arrived: the farewell, if any
                    raw.pgconn.is_busy()  # parses it: an error while idle goes to _note_farewell
                    raw.pgconn.consume_input()  # and the end of stream behind it
                except psycopg.OperationalError:
                    pass  # end of stream: status is now BAD, handled below
            if (raw.closed or raw.broken or raw.pgconn.status == psycopg.pq.ConnStatus.BAD
                    or raw in _farewelled):
                connection.close()
                raw, reconnected = None, True
        if raw is None:
            connection.ensure_connection()
            raw = connection.connection
        # Behind a transaction-pooling pooler no session SET (it would stay on a server connection that
        # serves other clients next, and not on ours): the flush statements there are not lock-bounded.
        if (raw not in _lock_bounded and raw.info.transaction_status == TransactionStatus.IDLE
                and not behind_pooler(connection)):
            # -- session: lock_timeout for a flush thread's statements (issue 16, S3) --
            # A coalesced statement carries other callers' rows: it must not wait for a stranger's
            # commit on one stream's row lock. On the timeout the coalescer splits the batch.
            result = raw.pgconn.exec_(LOCK_TIMEOUT.format(ms=int(lock_timeout_ms)).encode())
            if result.status == psycopg.pq.ExecStatus.COMMAND_OK:
                _lock_bounded.add(raw)
                raw.add_notice_handler(_note_farewell(raw))
        return reconnected

    def lock_stream(self, stream_id: str) -> None:
        with self.connection.cursor() as cursor:
            cursor.execute(LOCK_STREAM, [LOCK_STREAM_CLASS, stream_id])

    # == executions (flows) ==
    one_statement_executions = True

    def _bootstrap(self, boot: ExecutionBoot) -> bool:
        sql = executions_sql(BOOT, boot.companion.boot if boot.companion else "", conf.get("LOOM_NOTIFY"))
        params = {
            "sid": boot.item.stream_id,
            "ords": list(range(len(boot.encoded))),
            "types": [env.type for env in boot.item.envelopes],
            "payloads": boot.encoded,
            "channel": conf.get("LOOM_NOTIFY_CHANNEL"),
            "flow": boot.flow, "version": boot.version, "status": boot.status, "input": boot.input,
            "result": boot.result, "error": boot.error, "finished": boot.finished, "lease_owner": boot.lease_owner,
            "lease_ttl": boot.lease_ttl,
        }
        return self.execute_guarded(sql, params)[0][0] > 0

    def _bootstrap_many(self, boots: Sequence[ExecutionBoot]) -> set[str]:
        params = self.append_params([b.item for b in boots], [b.encoded for b in boots])
        params.update(flows=[b.flow for b in boots], statuses=[b.status for b in boots],
                      inputs=[b.input for b in boots], results=[b.result for b in boots],
                      errors=[b.error for b in boots], finished=[b.finished for b in boots],
                      versions=[b.version for b in boots])
        # One companion per statement: the batch's leases ride in the first leased boot's CTEs.
        companion = next((b.companion for b in boots if b.companion is not None), None)
        if companion is not None:
            params.update(lease_owners=[b.lease_owner if b.companion else None for b in boots],
                          lease_ttls=[b.lease_ttl for b in boots])
        sql = executions_sql(BOOT_MANY, companion.boot_many if companion else "", conf.get("LOOM_NOTIFY"))
        return {row[0] for row in self.execute_guarded(sql, params, binary_many(sql))}

    def _settle(self, settles: Sequence[ExecutionSettle]) -> list[Verdict]:
        items = [s.item for s in settles]
        params = self.append_params(items, [s.encoded for s in settles])
        notify = conf.get("LOOM_NOTIFY")
        if len(settles) == 1:  # the direct path: SETTLE, scalar header parameters
            one = settles[0]
            params.update(hid=one.item.stream_id, status=one.status, result=one.result, error=one.error,
                          lease_owner=one.lease_owner, lease_token=one.item.fence_token)
            row = self.execute_guarded(executions_sql(SETTLE, one.companion.settle if one.companion else "",
                                                      notify), params)[0]
            return [Verdict(row[0], row[1], row[2], row[3])]
        params.update(hids=[i.stream_id for i in items], hstatuses=[s.status for s in settles],
                      hresults=[s.result for s in settles], herrors=[s.error for s in settles])
        leased = [s for s in settles if s.companion is not None]
        companion = leased[0].companion if leased else None
        if companion is not None:
            params.update(lease_eids=[s.item.stream_id for s in leased], lease_owners=[s.lease_owner for s in leased],
                          lease_tokens=[s.item.fence_token for s in leased])
        sql = executions_sql(SETTLE_MANY, companion.settle_many if companion else "", notify)
        rows = self.execute_guarded(sql, params, binary_many(sql))
        by_stream = {row[0]: Verdict(row[0], row[1], row[2], row[3]) for row in rows}
        return [by_stream[item.stream_id] for item in items]

    # == waits ==
    wait_notifications = True

    def _lock_header(self, cursor, execution_id: str) -> str | None:
        cursor.execute(LOCK_HEADER, {"eid": execution_id})
        row = cursor.fetchone()
        return None if row is None else row[0]

    def lock_execution(self, execution_id):
        with self.connection.cursor() as cursor:
            return self._lock_header(cursor, execution_id)

    def park(self, wait, status):
        params = {"eid": wait.execution_id, "flow": wait.flow, "kind": wait.kind, "pos": wait.pos,
                  "token": wait.token, "due": wait.due_at, "topic": wait.topic, "child": wait.child,
                  "status": status, "now": timezone.now(), "channel": conf.get("LOOM_WAIT_CHANNEL")}
        with atomic(self.alias), self.connection.cursor() as cursor:
            self._lock_header(cursor, wait.execution_id)
            cursor.execute(PARK, params)
            row = cursor.fetchone()
        return False if row is None else row[0]

    def claim_due_waits(self, now, limit, flows):
        with atomic(self.alias), self.connection.cursor() as cursor:
            names, versions = flow_keys(flows or [])
            cursor.execute(CLAIM_DUE_ANY if flows is None else CLAIM_DUE,
                           {"now": now, "limit": limit, "flows": names, "versions": versions})
            taken = cursor.fetchall()
            if not taken:
                return []
            cursor.execute(CLAIM_FENCES, {"sids": [r[0] for r in taken], "tokens": [r[1] for r in taken]})
            tokens = dict(cursor.fetchall())
            if tokens:
                cursor.execute(CLAIM_HEADERS, {"eids": sorted(tokens)})
        return [ClaimedWait(r[0], tokens[r[0]], r[2], r[3], r[4]) for r in sorted(taken) if r[0] in tokens]

    def next_wait_due(self, flows=None):
        with self.connection.cursor() as cursor:
            names, versions = flow_keys(flows or [])
            cursor.execute(NEXT_DUE if flows is None else NEXT_DUE_OF, {"flows": names, "versions": versions})
            row = cursor.fetchone()
        return None if row is None else row[0]

    def explain_due_waits(self, flows=None):
        if flows is None:  # the flows this process would claim for (what its waker runs)
            from journal.flows import registry

            flows = registry.runnable()
        names, versions = flow_keys(flows)
        params = {"now": timezone.now(), "limit": conf.get("LOOM_WAIT_BATCH"), "flows": names, "versions": versions}
        with self.connection.cursor() as cursor:
            cursor.execute("EXPLAIN (FORMAT JSON) " + CLAIM_DUE, params)  # explained only: nothing is claimed
            claim = _plan_line(cursor.fetchone()[0])
            cursor.execute("EXPLAIN (FORMAT JSON) " + NEXT_DUE_OF, params)
            probe = _plan_line(cursor.fetchone()[0])
        return {"plan": claim[0], "cost": claim[1], "next_due_plan": probe[0], "next_due_cost": probe[1]}

    def carry_messages(self, from_id, to_id, now):
        with atomic(self.alias), self.connection.cursor() as cursor:
            self._lock_header(cursor, to_id)
            cursor.execute(CARRY_MESSAGES, {"from": from_id, "to": to_id})
            topics = [row[0] for row in cursor.fetchall()]
            cursor.execute(CARRY_FLOW_EVENTS, {"from": from_id, "to": to_id, "channel": conf.get("LOOM_WAIT_CHANNEL")})
            for topic in topics:
                cursor.execute(WAKE, {"eid": to_id, "now": now, "topic": topic, "child": None,
                                      "channel": conf.get("LOOM_WAIT_CHANNEL")})
        return len(topics)

    def wake_wait(self, execution_id, now, *, topic=None, child=None):
        params = {"eid": execution_id, "now": now, "topic": topic, "child": child,
                  "channel": conf.get("LOOM_WAIT_CHANNEL")}
        with atomic(self.alias), self.connection.cursor() as cursor:
            self._lock_header(cursor, execution_id)
            cursor.execute(WAKE, params)
            return cursor.fetchone()[0] > 0

    def drop_wait(self, execution_id):
        with self.connection.cursor() as cursor:
            cursor.execute(DROP_WAIT, [execution_id])

    def wait_of(self, execution_id):
        with self.connection.cursor() as cursor:
            cursor.execute(WAIT_OF, [execution_id])
            row = cursor.fetchone()
        if row is None:
            return None
        return dict(zip(("kind", "pos", "token", "due_at", "topic", "child", "flow"), row, strict=True))

    def set_execution_status(self, execution_id, token, status):
        with self.connection.cursor() as cursor:
            cursor.execute(SET_STATUS, {"eid": execution_id, "token": token, "status": status})
            return cursor.rowcount > 0

    def send_message(self, execution_id, topic, message_id, payload, now):
        with atomic(self.alias), self.connection.cursor() as cursor:
            status = self._lock_header(cursor, execution_id)
            if status is None or status in SETTLED_STATUSES:
                return status, False
            cursor.execute(SEND, {"eid": execution_id, "topic": topic, "mid": message_id, "payload": payload})
            inserted = cursor.fetchone() is not None
            if inserted:
                cursor.execute(WAKE, {"eid": execution_id, "now": now, "topic": topic, "child": None,
                                      "channel": conf.get("LOOM_WAIT_CHANNEL")})
        return status, inserted

    def pending_message(self, execution_id, topic):
        with self.connection.cursor() as cursor:
            cursor.execute(PENDING_MESSAGE, [execution_id, topic])
            row = cursor.fetchone()
        return None if row is None else (row[0], row[1], _json_value(row[2]))

    def consume_message(self, row_id, seq, now):
        with self.connection.cursor() as cursor:
            cursor.execute(CONSUME, [now, seq, row_id])
            return cursor.rowcount == 1

    def messages_of(self, execution_id, limit):
        with self.connection.cursor() as cursor:
            cursor.execute(MESSAGES_OF, [execution_id, limit])
            rows = cursor.fetchall()
        return [{"message_id": r[0], "topic": r[1], "payload": _json_value(r[2]), "sent_at": r[3],
                 "consumed_at": r[4]} for r in rows]

    def put_flow_event(self, execution_id, key, value):
        with self.connection.cursor() as cursor:
            cursor.execute(PUT_FLOW_EVENT, {"eid": execution_id, "key": key, "value": value,
                                            "channel": conf.get("LOOM_WAIT_CHANNEL")})

    def flow_event(self, execution_id, key):
        with self.connection.cursor() as cursor:
            cursor.execute(FLOW_EVENT, [execution_id, key])
            row = cursor.fetchone()
        return (False, None) if row is None else (True, _json_value(row[0]))

    def save_snapshot(self, snapshot: SnapshotRecord) -> None:
        state = jsonvalues.dumps(snapshot.state, f"snapshot state of {snapshot.stream_id}")
        with self.guarded(), self.connection.cursor() as cursor:
            cursor.execute(SAVE_SNAPSHOT, [snapshot.stream_id, snapshot.seq, state])

    # == for other apps: fences, executions recovery, event reads ==
    sql = {"mark_recovered": MARK_RECOVERED, "mark_stuck": MARK_STUCK, "wake_stuck_parents": WAKE_STUCK_PARENTS,
           "count_recovery": COUNT_RECOVERY}

    def _advance_fences(self, stream_ids, expected_token):
        with self.connection.cursor() as cursor:
            cursor.execute(ADVANCE_FENCES, {"sids": list(stream_ids), "expected": expected_token})
            return cursor.fetchall()

    def read(self, stream_id, after_seq=-1, limit=None, reader=None):
        """The shared read; with sealed data in use, READ_SEALED brings the subjects' keys along."""
        if not codec.active():
            return super().read(stream_id, after_seq, limit, reader)
        with self.connection.cursor() as cursor:
            cursor.execute(READ_SEALED, {"stream": stream_id, "after": after_seq, "limit": limit})
            rows = cursor.fetchall()
        events = [StoredEvent.from_row(row[:6]) for row in rows]
        key_rows = {row[6]: (row[7], row[8]) for row in rows if row[6] is not None}
        return codec.reveal(self, events, reader, key_rows) if events else events

    def read_after(self, pairs, batch):
        pairs = sorted(set(pairs))
        found: dict[tuple[str, int], list[StoredEvent]] = {p: [] for p in pairs}
        if pairs:
            with self.connection.cursor() as cursor:
                cursor.execute(READ_AFTER, {"streams": [p[0] for p in pairs], "ats": [p[1] for p in pairs],
                                            "batch": batch})
                for row in cursor.fetchall():
                    found[(row[2], row[0])].append(StoredEvent.from_row(row[1:]))
        return self.reveal_found(found)


def _json_value(value):
    """A jsonb column's value (psycopg decodes jsonb; a text fallback for other adapters)."""
    return json.loads(value) if isinstance(value, str) else value


_ONLY_WHEN_ASKED = 2**31
PLAN_CACHE_MODE = "SET plan_cache_mode = force_generic_plan"
_generic: weakref.WeakSet = weakref.WeakSet()  # connections whose session has PLAN_CACHE_MODE
LOCK_TIMEOUT = "SET lock_timeout = '{ms}ms'"
_lock_bounded: weakref.WeakSet = weakref.WeakSet()  # flush connections whose session has LOCK_TIMEOUT
_farewelled: weakref.WeakSet = weakref.WeakSet()  # flush connections the server said FATAL on while idle


def _note_farewell(raw) -> Callable[[psycopg.errors.Diagnostic], None]:
    """A notice handler: libpq hands an error that arrives while no query runs (the server's FATAL
    before it closes an idle connection) to the notice processor; remember that connection."""
    ref = weakref.ref(raw)

    def handler(diagnostic: psycopg.errors.Diagnostic) -> None:
        conn = ref()
        if conn is not None and diagnostic.severity_nonlocalized in ("FATAL", "PANIC"):
            _farewelled.add(conn)

    return handler


def may_prepare(connection) -> bool:
    """Whether named prepared statements may be used on this connection: not when LOOM_PG_PREPARE is off,
    nor on an alias behind a transaction-pooling PgBouncer (DISABLE_SERVER_SIDE_CURSORS, Django's own
    marker for it): the pooler hands each transaction to any server connection, where a statement
    prepared on another one does not exist (PgBouncer before 1.21 cannot track them). Unnamed statements
    (server-side binding) still work there: they live for one message exchange only."""
    from journal import conf

    return conf.get("LOOM_PG_PREPARE") and not behind_pooler(connection)


def behind_pooler(connection) -> bool:
    """The alias goes through a transaction-pooling pooler (DISABLE_SERVER_SIDE_CURSORS, as Django asks for
    PgBouncer): no named prepared statements and no session state (SET, LISTEN) may be left on it, since
    the next transaction may run on another server connection and this one's serves other clients."""
    return bool(connection.settings_dict.get("DISABLE_SERVER_SIDE_CURSORS"))


def execute_prepared(connection, cursor, sql: str, params, binary_sql: str | None = None) -> None:
    """Run one of the journal's fixed statements as a server-side prepared statement.

    Django connects with psycopg's prepare_threshold=None, so every execution of APPEND would be
    parsed and planned again; planning the CTE was about half of a one-event append's cost. With
    server-side binding the text is fixed and the arrays carry any batch size, so one plan per
    connection serves every append. Through Django's debug cursor (DEBUG, or a test capturing
    queries) the statement is still logged. Client-side binding cannot prepare: plain execute.
    `binary_sql`: the same statement with binary array parameters (binary_arrays), sent instead where
    it is prepared.
    """
    raw = cursor.cursor
    if isinstance(raw, psycopg.ClientCursor) or not may_prepare(connection):
        cursor.execute(sql, params)
        return
    if raw.connection.prepare_threshold is None:
        # None disables even an explicit prepare=True; a threshold no other query reaches keeps
        # Django's own queries unprepared (as Django intends) and lets ours ask for it.
        raw.connection.prepare_threshold = _ONLY_WHEN_ASKED
    if raw.connection not in _generic and raw.connection.info.transaction_status == TransactionStatus.IDLE:
        # -- session: plan_cache_mode = force_generic_plan (issue 16) --
        # A prepared statement is still planned again at every execution while PostgreSQL prefers
        # custom plans, and it did for APPEND: 0.22 ms of planning per append for 0.09 ms of
        # execution (EXPLAIN ANALYZE EXECUTE, 10th run). Our statements take arrays, whose values a
        # custom plan cannot use, so the generic plan is the same plan without the planning. Only
        # prepared statements are affected, and only ours are prepared on this connection (above).
        # Set outside any transaction, so that a rollback cannot undo it; sent through libpq like
        # the driver's own session set-up (a connection's one-time set-up, not one of its statements).
        result = raw.connection.pgconn.exec_(PLAN_CACHE_MODE.encode())
        if result.status == psycopg.pq.ExecStatus.COMMAND_OK:
            _generic.add(raw.connection)
    connection.validate_no_broken_transaction()
    if binary_sql is not None:
        sql = binary_sql
    if isinstance(cursor, CursorDebugWrapper):
        with cursor.debug_sql(sql, params), connection.wrap_database_errors:
            raw.execute(sql, params, prepare=True)
        return
    with connection.wrap_database_errors:
        raw.execute(sql, params, prepare=True)


def _plan_line(value) -> tuple[str, float | None]:
    """A JSON plan as one line (node types and the indexes they use, nested) and its total cost."""
    plan = (json.loads(value) if isinstance(value, str) else value)[0]["Plan"]

    def line(node: dict) -> str:
        text = node["Node Type"] + (f" using {node['Index Name']}" if node.get("Index Name") else "")
        children = node.get("Plans") or []
        return text + (f" [{', '.join(line(child) for child in children)}]" if children else "")

    return line(plan), plan.get("Total Cost")
