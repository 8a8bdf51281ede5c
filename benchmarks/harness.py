"""Driving concurrent work for benchmarks: N threads, each with its own database connection."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from django.db import connections
from django.db.backends.signals import connection_created


@dataclass
class Outcome:
    """What the workers of one cell did: per-operation latencies, units written, errors, wall time."""

    latencies_ms: list[float] = field(default_factory=list)
    units: int = 0
    errors: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def throughput(self) -> float:
        return self.units / self.wall_s if self.wall_s > 0 else 0.0


def run_workers(concurrency: int, ops: int, operation: Callable[[int, int], int],
                setup: Callable[[int], None] | None = None, teardown: Callable[[int], None] | None = None,
                progress: Callable[[int], None] | None = None) -> Outcome:
    """Run `operation(worker, i)` for i in range(ops) on each of `concurrency` threads.

    Each call returns how many units (events, executions...) it wrote. All threads start together
    after their setup, so connection set-up stays out of the timed window. Every thread closes its
    own connections at the end.
    """
    outcome = Outcome()
    lock = threading.Lock()
    ready = threading.Barrier(concurrency + 1)
    go = threading.Event()

    def worker(index: int) -> None:
        local: list[float] = []
        units = 0
        try:
            if setup:
                setup(index)
        except Exception as exc:  # reported, then the cell fails loudly
            with lock:
                outcome.errors.append(f"setup {index}: {type(exc).__name__}: {exc}")
        ready.wait()
        go.wait()
        try:
            for i in range(ops):
                start = time.perf_counter()
                units += operation(index, i)
                local.append((time.perf_counter() - start) * 1000)
                if progress and i % 16 == 15:
                    progress(16)
        except Exception as exc:
            with lock:
                outcome.errors.append(f"worker {index}: {type(exc).__name__}: {exc}")
        finally:
            try:
                if teardown:
                    teardown(index)
            finally:
                connections.close_all()
            with lock:
                outcome.latencies_ms.extend(local)
                outcome.units += units

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    ready.wait()
    started = time.perf_counter()
    go.set()
    for thread in threads:
        thread.join()
    outcome.wall_s = time.perf_counter() - started
    return outcome


CONTROL = ("BEGIN", "SAVEPOINT", "RELEASE", "ROLLBACK", "COMMIT")


class StatementCounter:
    """Counts the statements database connections run, at the driver, whoever issued them (the
    journal's store, including its server-side prepared statements that bypass Django's cursor
    wrappers; the ORM; transaction control). `control` counts BEGIN / SAVEPOINT / RELEASE / ROLLBACK
    / COMMIT among them.

    SQLite: the connection's trace callback, called for every statement SQLite runs (BEGIN and
    COMMIT included). PostgreSQL: a psycopg cursor class counting execute/executemany; the BEGIN
    and COMMIT psycopg sends on its own around a transaction block are not seen (appends run in
    autocommit and have none)."""

    def __init__(self) -> None:
        self.statements = 0
        self.control = 0
        self._lock = threading.Lock()

    def count(self, sql) -> None:
        text = sql.decode() if isinstance(sql, bytes) else str(sql)
        control = text.lstrip()[:9].upper().startswith(CONTROL)
        with self._lock:
            self.statements += 1
            self.control += control

    def snapshot(self) -> tuple[int, int]:
        with self._lock:
            return self.statements, self.control

    def install(self, wrapper) -> None:
        """Count the statements of one open Django connection (`wrapper.connection` is the driver's)."""
        raw = wrapper.connection
        if wrapper.vendor == "sqlite":
            raw.set_trace_callback(self.count)
        elif wrapper.vendor == "postgresql":
            raw.cursor_factory = _counting_cursor(raw.cursor_factory, self)


def _counting_cursor(base: type, counter: StatementCounter) -> type:
    class CountingCursor(base):  # type: ignore[misc, valid-type]
        def execute(self, query, params=None, **kwargs):
            counter.count(query if isinstance(query, (str, bytes)) else "")
            return super().execute(query, params, **kwargs)

        def executemany(self, query, params_seq, **kwargs):
            counter.count(query if isinstance(query, (str, bytes)) else "")
            return super().executemany(query, params_seq, **kwargs)

    return CountingCursor


@contextmanager
def counting_statements() -> Iterator[StatementCounter]:
    """Count every statement of every database connection opened inside the block, in any thread
    (worker threads, the coalescer's flush threads). Connections opened before the block (the calling
    thread's own) are not counted, so its verification queries stay out of the figures."""
    counter = StatementCounter()
    uid = f"bench-count-{id(counter)}"

    def install(sender, connection, **kwargs) -> None:
        counter.install(connection)

    connection_created.connect(install, weak=False, dispatch_uid=uid)
    try:
        yield counter
    finally:
        connection_created.disconnect(dispatch_uid=uid)
