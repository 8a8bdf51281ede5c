"""The retention service of a worker (journal/retention.py decides and removes; this runs it).

Every worker runs it; on each shard one remover at a time does a batch (the batch's advisory lock on
PostgreSQL, the write lock on SQLite), the others' rounds return at once. A round runs batches until nothing
is due, then sleeps LOOM_RETENTION_EVERY. Nothing to do (no retention configured): a sleep per round.
"""

from __future__ import annotations

import logging
import threading

from django.apps import apps
from django.db import DatabaseError, connections, router

from journal import conf, retention, shards

log = logging.getLogger("loom.retention")


def drop_removed(execution_ids: list[str], alias: str) -> None:
    """journal.retention.REMOVE_HOOKS: the lease rows and start reservations of removed executions."""
    from leases.store import store_for

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

    def start(self, worker) -> None:
        self.thread = threading.Thread(target=self._loop, name="loom-retention", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        try:
            while not self.stopping.wait(conf.get("LOOM_RETENTION_EVERY")):
                if not retention.groups():
                    continue
                for alias in shards.shards():
                    if self.stopping.is_set():
                        break
                    self._round(alias)
        finally:
            connections.close_all()

    def _round(self, alias: str) -> None:
        try:
            while not self.stopping.is_set():
                batch = retention.remove_batch(alias)
                if batch.skipped or not batch.ids:
                    return
        except (DatabaseError, OSError, retention.ArchiveError) as exc:
            log.warning("retention batch on %s failed (nothing removed by it); retrying next round: %s", alias, exc)
            connections[alias].close()
        except Exception:  # a storage backend's own error (boto's ClientError, say): the thread must live on
            log.exception("retention batch on %s failed (nothing removed by it); retrying next round", alias)

    def quiesce(self) -> None:
        self.stopping.set()

    def stop(self, timeout: float) -> None:
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(timeout)
