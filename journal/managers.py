"""The only write path of the log: `Event.objects.append()` and `append_batch()`.

The managers are thin: they validate and hand over to the store of the database they are bound
to (journal/store), where the SQL of each backend lives. `append` goes through the process's
cross-stream coalescer (journal/coalesce.py, LOOM_COALESCE, on by default): a caller alone, or
inside a transaction, appends directly on its own connection; appends of many threads at once
share statements.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from django.db import models

from journal import coalesce, shards
from journal.envelopes import (
    Appended,
    AppendItem,
    Envelope,
    SnapshotRecord,
    StoredEvent,
    check_stream_id,
    check_token,
)
from journal.store import store_for


def _stream_store(manager: models.Manager, stream_id: str):
    """The store of the stream's shard (journal/shards.py `shard_for`), or of the alias the manager was
    explicitly bound to (`Event.objects.db_manager(alias)`, `.using(alias)`)."""
    return store_for(manager._db or shards.shard_for(stream_id))


class EventManager(models.Manager):
    def _store(self, stream_id: str):
        return _stream_store(self, stream_id)

    def append(self, stream_id: str, envelopes: Iterable[Envelope] | Envelope, *, fence_token: int | None = None,
               expected_seq: int | None = None) -> Appended:
        """Append events to one stream at its next seqs, guarded by fence token and/or expected tip."""
        item = AppendItem.build(stream_id, envelopes, fence_token, expected_seq)
        if coalesce.enabled():  # adaptive: alone (or in a transaction) it is the direct append below
            return coalesce.shared_coalescer(self._db or shards.shard_for(stream_id)).append_item(item)
        return self._store(stream_id).append_batch([item])[0]

    def append_batch(self, items: Sequence[AppendItem | tuple]) -> list[Appended]:
        """Append for many streams in one statement per shard, every stream guarded; all or nothing on each
        shard (journal/shards.py: nothing is atomic across shards; ShardsPartlyWritten says which were)."""
        built = [
            item if isinstance(item, AppendItem) else AppendItem.build(*item)
            for item in items
        ]
        if self._db is not None or not shards.sharded():
            return self._store(built[0].stream_id if built else "").append_batch(built)
        return shards.append_per_shard(built)

    def open_stream(self, stream_id: str, envelopes: Iterable[Envelope] | Envelope) -> tuple[int, Appended]:
        """Bootstrap a single-writer stream: write its seq 0.. and fence token 1 together.

        Raises StreamExists if the stream already has events or a fence. Returns (token, appended).
        """
        item = AppendItem.build(stream_id, envelopes)
        return self._store(stream_id).open_stream(item)

    def read(self, stream_id: str, after_seq: int = -1, limit: int | None = None, *, reader=None) -> list[StoredEvent]:
        """The stream's events after `after_seq`, in seq order (at most `limit`).

        Reads check their arguments like writes do (InvalidStream, InvalidGuard), so a bad id gets
        our error instead of the database's."""
        check_stream_id(stream_id)
        check_token(after_seq, "after_seq", stream_id, minimum=-1)
        check_token(limit, "limit", stream_id, minimum=0)
        return self._store(stream_id).read(stream_id, after_seq, limit, reader)

    def tip(self, stream_id: str) -> int:
        """The seq of the stream's last event, -1 if it has none."""
        return self._store(stream_id).tip(check_stream_id(stream_id))


class FenceManager(models.Manager):
    def _store(self, stream_id: str):
        return _stream_store(self, stream_id)

    def advance(self, stream_id: str, expected_token: int | None = None) -> int:
        """Take over a stream: bump its fence, so every writer holding an older token is refused."""
        check_stream_id(stream_id)
        check_token(expected_token, "expected_token", stream_id)
        return self._store(stream_id).advance_fence(stream_id, expected_token)

    def current(self, stream_id: str) -> int | None:
        return self._store(stream_id).current_fence(check_stream_id(stream_id))


class SnapshotManager(models.Manager):
    def _store(self, stream_id: str):
        return _stream_store(self, stream_id)

    def save_state(self, stream_id: str, seq: int, state) -> None:
        """Checkpoint a stream's folded state at `seq` (idempotent: an existing one is kept).

        The state is encoded by the same JSON boundary as payloads (journal/jsonvalues.py)."""
        check_stream_id(stream_id)
        check_token(seq, "snapshot seq", stream_id, minimum=0)
        self._store(stream_id).save_snapshot(SnapshotRecord(stream_id, seq, state))

    def latest(self, stream_id: str) -> SnapshotRecord | None:
        return self._store(stream_id).latest_snapshot(check_stream_id(stream_id))
