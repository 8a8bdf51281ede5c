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
    """Counts the statements Django connections execute: an `execute_wrapper`, so every statement sent
    through a Django cursor is seen, whatever issued it (the journal's store, the ORM, transaction
    control). `control` counts BEGIN / SAVEPOINT / RELEASE / ROLLBACK / COMMIT among them."""

    def __init__(self) -> None:
        self.statements = 0
        self.control = 0
        self._lock = threading.Lock()

    def __call__(self, execute, sql, params, many, context):
        control = str(sql).lstrip()[:9].upper().startswith(CONTROL)
        with self._lock:
            self.statements += 1
            self.control += control
        return execute(sql, params, many, context)

    def snapshot(self) -> tuple[int, int]:
        with self._lock:
            return self.statements, self.control


@contextmanager
def counting_statements() -> Iterator[StatementCounter]:
    """Count every statement of every Django connection opened inside the block, in any thread (worker
    threads, the coalescer's flush threads): a process-wide, connection-level counter. Connections
    opened before the block (the calling thread's own) are not counted."""
    counter = StatementCounter()

    def install(sender, connection, **kwargs) -> None:
        if counter not in connection.execute_wrappers:
            connection.execute_wrappers.append(counter)

    connection_created.connect(install, weak=False, dispatch_uid=f"bench-count-{id(counter)}")
    try:
        yield counter
    finally:
        connection_created.disconnect(dispatch_uid=f"bench-count-{id(counter)}")
