"""The per-process LRU cache of aggregate states: the latest known state and version per stream.

Rules that keep it safe (see docs/aggregates.md):
- It only ever holds committed states. The runtime puts after its own commit (or, inside a
  transaction, from `on_commit`), and after a replay of committed events.
- `put` is monotonic: an entry is never replaced by an older version, so two threads of one
  process racing to store what they saw can never make it forget what this process committed.
- A concurrency error marks the entry stale instead of dropping it: a stale entry is never
  served as is; the next load reads only the events after it and stores the fresh state.
- It is a cache, not a source of truth: correctness of a commit rests on the journal's
  expected-seq guard, so several processes with different caches stay correct.

Size: LOOM_AGGREGATE_CACHE_SIZE entries (0 disables the cache), read on every put so that a
settings override takes effect at once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from journal import conf

Key = tuple[str, str]  # (state name, stream id)


class StateCache:
    """A thread-safe LRU of `(value, version)` per key, with stale marks."""

    def __init__(self, size: int | None = None):
        self._size = size
        self._entries: OrderedDict[Key, tuple[Any, int, bool]] = OrderedDict()  # value, version, stale
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    @property
    def size(self) -> int:
        return conf.get("LOOM_AGGREGATE_CACHE_SIZE") if self._size is None else self._size

    def get(self, key: Key) -> tuple[Any, bool] | None:
        """(value, stale) of a key, refreshing its recency; None when absent."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            if entry[2]:
                self.misses += 1
            else:
                self.hits += 1
            return entry[0], entry[2]

    def put(self, key: Key, value: Any, version: int) -> bool:
        """Store a committed state unless the entry already holds a newer one; True if stored."""
        size = self.size
        if size <= 0:
            return False
        with self._lock:
            entry = self._entries.get(key)
            # Monotonic: an equal version replaces a stale entry (it was just verified); an older
            # one is a thread that read before another thread of ours committed: ignore it.
            if entry is not None and (entry[1] > version or (entry[1] == version and not entry[2])):
                self._entries.move_to_end(key)
                return False
            self._entries[key] = (value, version, False)
            self._entries.move_to_end(key)
            while len(self._entries) > size:
                self._entries.popitem(last=False)
            return True

    def mark_stale(self, key: Key) -> None:
        """The entry lost a race: keep it as a starting point, but never serve it unverified."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries[key] = (entry[0], entry[1], True)

    def discard(self, key: Key) -> None:
        with self._lock:
            self._entries.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Key) -> bool:
        return key in self._entries


cache = StateCache()
"""The process-wide cache the runtime uses."""
