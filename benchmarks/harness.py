"""Driving concurrent work for benchmarks: N threads, each with its own database connection."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from django.db import connections


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
