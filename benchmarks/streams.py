"""Benchmark streams: named per run, counted for verification, removed afterwards unless --keep.

The counts and the clean-up are the journal store's (its statements for benchmarks and tests), on the
default database, where the benches write.
"""

from __future__ import annotations

from journal.store import store_for


def prefix(run_id: int, *parts) -> str:
    return ":".join(["bench", str(run_id), *map(str, parts)]) + ":"


def count_events(stream_prefix: str) -> int:
    return store_for().count_events(stream_prefix)


def check_contiguous(stream_prefix: str) -> int:
    """Streams under the prefix whose seqs are not exactly 0..n-1 (duplicates are impossible by index)."""
    return store_for().count_gapped_streams(stream_prefix)


def remove(stream_prefix: str) -> None:
    """Delete a benchmark's own streams. Maintenance of benchmark data only: the journal's write path
    never deletes; this exists so that the default SQLite file does not grow with every bench run."""
    store_for().delete_streams(stream_prefix)
