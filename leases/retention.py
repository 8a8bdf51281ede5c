"""The retention service of a worker (journal/retention.py decides and removes; this runs it).

Every worker runs it; on each shard one remover at a time does a batch (the batch's advisory lock on
PostgreSQL, the write lock on SQLite), the others' rounds return at once. A round runs batches until nothing
is due (pausing LOOM_RETENTION_DUTY * each batch's time after it), then sleeps LOOM_RETENTION_EVERY. Nothing
to do (no retention configured): a sleep per round.
It also compacts the aggregate streams of the compacted states (journal/compaction.py), after the removal, and
(LOOM_REINDEX_RATIO) rebuilds the event table's indexes once removal has bloated them (journal/reindex.py).
"""

from __future__ import annotations

import logging
import threading
import time

from django.apps import apps
from django.db import DatabaseError, connections, router

from journal import compaction, conf, reindex, retention, shards
from leases.store import store_for

log = logging.getLogger("loom.retention")


def drop_removed(execution_ids: list[str], alias: str) -> None:
    """journal.retention.REMOVE_HOOKS: the lease rows and start reservations of removed executions."""

    # under LOOM_SHARDS the reservations live on `default`, whatever the batch's shard
    home = router.db_for_write(apps.get_model("leases", "StartReservation"))
    if home == alias:
        store_for(alias).drop_removed(execution_ids)
        return
    store_for(alias).drop_removed(execution_ids, reservations=False)
    store_for(home).drop_removed(execution_ids, leases=False)  # its own commit: a reservation of a removed id


class RetentionService:
    name = "retention"

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None
        self.next_reindex: dict[str, float] = {}  # alias -> time.monotonic() of its next index check

    def start(self, worker) -> None:
        self.thread = threading.Thread(target=self._loop, name="loom-retention", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        try:
            while not self.stopping.wait(conf.get("LOOM_RETENTION_EVERY")):
                removing, compacting = bool(retention.groups()), self._compacting()
                reindexing = conf.get("LOOM_REINDEX_RATIO") is not None
                for alias in shards.shards() if removing or compacting or reindexing else ():
                    if self.stopping.is_set():
                        break
                    if removing:
                        self._round(alias)
                    if compacting:
                        self._compact(alias)
                    self._reindex(alias)
        finally:
            connections.close_all()

    def _round(self, alias: str) -> None:
        try:
            retention.run(alias, stop=self.stopping)  # paced by LOOM_RETENTION_DUTY; a quiesce stops it
        except (DatabaseError, OSError, retention.ArchiveError) as exc:
            log.warning("retention batch on %s failed (nothing removed by it); retrying next round: %s", alias, exc)
            connections[alias].close()
        except Exception:  # a storage backend's own error (boto's ClientError, say): the thread must live on
            log.exception("retention batch on %s failed (nothing removed by it); retrying next round", alias)

    @staticmethod
    def _compacting() -> bool:
        try:
            return bool(compaction.compacted_states())
        except conf.ConfigError as exc:  # loom.E001-style: the start-up check names it; the thread lives on
            log.warning("compaction is misconfigured, nothing compacted: %s", exc)
            return False

    def _compact(self, alias: str) -> None:
        """Compact the compacted states' streams on `alias` (journal/compaction.py: batches that take no lock an
        append waits on); a failure leaves the batches already committed, the next round goes on."""
        try:
            compaction.run(alias)
        except (DatabaseError, OSError) as exc:
            log.warning("compaction on %s failed (its batches so far are committed); retrying next round: %s",
                        alias, exc)
            connections[alias].close()
        except Exception:
            log.exception("compaction on %s failed; retrying next round", alias)

    def _reindex(self, alias: str) -> None:
        """Rebuild the event table's indexes on `alias` once removal has bloated them (journal/reindex.py: off unless
        LOOM_REINDEX_RATIO is set; looked at once per LOOM_REINDEX_EVERY per shard; one rebuilder per shard)."""
        if conf.get("LOOM_REINDEX_RATIO") is None:
            return
        now = time.monotonic()
        if now < self.next_reindex.get(alias, 0.0):
            return
        self.next_reindex[alias] = now + conf.get("LOOM_REINDEX_EVERY")
        try:
            reindex.run(alias)
        except (DatabaseError, OSError) as exc:
            log.warning("index rebuild on %s failed (an invalid copy it left is dropped next time): %s", alias, exc)
            connections[alias].close()
        except Exception:
            log.exception("index rebuild on %s failed", alias)

    def quiesce(self) -> None:
        self.stopping.set()

    def stop(self, timeout: float) -> None:
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(timeout)
