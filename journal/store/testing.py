"""Upkeep for benchmarks and tests: counts and clean-up by id prefix, and the growth bench's bulk fill.

Not part of the journal's store interfaces (the write path never deletes): every backend gets these,
the same statements on both, by the JournalStore base mixing JournalUpkeep in; a new backend writes none
of them (docs/backends.md). procrastinate keeps its test upkeep apart the same way (its testing.py).
"""

from __future__ import annotations

from collections.abc import Sequence


class JournalUpkeep:
    """Benchmarks' and tests' counts and clean-up on the journal's tables, by id prefix (or ids)."""

    def count_events(self, prefix: str) -> int:
        """Events of the streams whose id starts with `prefix`."""
        return self._one(COUNT_EVENTS, [prefix + "%"])

    def count_gapped_streams(self, prefix: str) -> int:
        """Streams under `prefix` whose seqs are not exactly 0..n-1."""
        return self._one(COUNT_GAPPED_STREAMS, [prefix + "%"])

    def events_per_stream(self, prefix: str) -> tuple[int, int | None, int | None]:
        """(streams, fewest events in one, most events in one) under `prefix`."""
        with self.connection.cursor() as cursor:
            cursor.execute(EVENTS_PER_STREAM, [prefix + "%"])
            return cursor.fetchone()

    def count_executions(self, prefix: str, status: str) -> int:
        """Execution headers under `prefix` with this status."""
        return self._one(COUNT_EXECUTIONS, [prefix + "%", status])

    def delete_streams(self, prefix: str | None = None, ids: Sequence[str] | None = None) -> None:
        """Delete the events, fences and snapshots of the streams under `prefix` (or named in `ids`)."""
        self._delete(DELETE_STREAMS, prefix, ids)

    def delete_executions(self, prefix: str | None = None, ids: Sequence[str] | None = None) -> None:
        """Delete the execution headers under `prefix` (or named in `ids`), with their wait rows,
        messages and flow events."""
        self._delete(DELETE_EXECUTIONS, prefix, ids)

    def fill_growth(self, prefix: str, first: int, count: int, per_stream: int, payload: str) -> None:
        """Benchmarks only: streams `prefix{n}` for n in first..first+count-1, each with `per_stream`
        events (seq 0..), fence token 1 and a running execution header, bulk loaded (bulk_load)."""
        now = self.now()
        ids = [f"{prefix}{n}" for n in range(first, first + count)]
        self.bulk_load(*FILL_EVENTS, ((sid, seq, "BenchFilled", payload, now) for sid in ids
                                      for seq in range(per_stream)))
        self.bulk_load(*FILL_FENCES, ((sid, 1, now) for sid in ids))
        self.bulk_load(*FILL_EXECUTIONS, ((sid, "bench.growth", "running", "{}", None, "", 0, now, now, None)
                                          for sid in ids))
        self.analyze(FILL_EVENTS[0], FILL_FENCES[0], FILL_EXECUTIONS[0])

    def _one(self, sql: str, params) -> int:
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchone()[0]

    def _delete(self, statements: tuple[str, ...], prefix: str | None, ids: Sequence[str] | None) -> None:
        with self.connection.cursor() as cursor:
            if prefix is not None:
                for sql in statements:
                    cursor.execute(sql.format(where="LIKE %s"), [prefix + "%"])
            for start in range(0, len(ids or ()), 500):
                part = list(ids[start:start + 500])
                for sql in statements:
                    cursor.execute(sql.format(where=f"IN ({', '.join(['%s'] * len(part))})"), part)


# -- count_events / count_gapped_streams / events_per_stream / count_executions -- (benchmarks, tests)
COUNT_EVENTS = "SELECT count(*) FROM journal_event WHERE stream_id LIKE %s"
COUNT_GAPPED_STREAMS = """
SELECT count(*) FROM (SELECT stream_id FROM journal_event WHERE stream_id LIKE %s
GROUP BY stream_id HAVING max(seq) + 1 <> count(*) OR min(seq) <> 0) bad
"""
EVENTS_PER_STREAM = """
SELECT count(DISTINCT stream_id), min(n), max(n) FROM (SELECT stream_id, count(*) AS n
FROM journal_event WHERE stream_id LIKE %s GROUP BY stream_id) s
"""
COUNT_EXECUTIONS = "SELECT count(*) FROM journal_execution WHERE id LIKE %s AND status = %s"

# -- fill_growth -- (benchmarks: the growth section's pre-filled journal, through bulk_load)
FILL_EVENTS = ("journal_event", ("stream_id", "seq", "type", "payload", "recorded_at"))
FILL_FENCES = ("journal_fence", ("stream_id", "token", "created_at"))
FILL_EXECUTIONS = ("journal_execution", ("id", "flow", "status", "input", "result", "error", "recoveries",
                                         "created_at", "updated_at", "finished_at"))

# -- delete_streams / delete_executions -- (benchmarks, tests: maintenance of their own rows only)
DELETE_STREAMS = (
    "DELETE FROM journal_event WHERE stream_id {where}",
    "DELETE FROM journal_fence WHERE stream_id {where}",
    "DELETE FROM journal_snapshot WHERE stream_id {where}",
)
# An execution's wait row, messages and flow events go with its header: a wait row left behind would
# be claimed (and refused) by every later waker.
DELETE_EXECUTIONS = (
    "DELETE FROM journal_wait WHERE execution_id {where}",
    "DELETE FROM journal_message WHERE execution_id {where}",
    "DELETE FROM journal_flowevent WHERE execution_id {where}",
    "DELETE FROM journal_execution WHERE id {where}",
)
