"""Benchmark streams: named per run, counted for verification, removed afterwards unless --keep."""

from __future__ import annotations

from django.db import connection


def prefix(run_id: int, *parts) -> str:
    return ":".join(["bench", str(run_id), *map(str, parts)]) + ":"


def count_events(stream_prefix: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM journal_event WHERE stream_id LIKE %s", [stream_prefix + "%"])
        return cursor.fetchone()[0]


def check_contiguous(stream_prefix: str) -> int:
    """Streams under the prefix whose seqs are not exactly 0..n-1 (duplicates are impossible by index)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM (SELECT stream_id FROM journal_event WHERE stream_id LIKE %s"
            " GROUP BY stream_id HAVING max(seq) + 1 <> count(*) OR min(seq) <> 0) bad",
            [stream_prefix + "%"],
        )
        return cursor.fetchone()[0]


def remove(stream_prefix: str) -> None:
    """Delete a benchmark's own streams. Maintenance of benchmark data only: the journal's write path
    never deletes; this exists so that the default SQLite file does not grow with every bench run."""
    like = [stream_prefix + "%"]
    with connection.cursor() as cursor:
        for table in ("journal_event", "journal_fence", "journal_snapshot"):
            cursor.execute(f"DELETE FROM {table} WHERE stream_id LIKE %s", like)
