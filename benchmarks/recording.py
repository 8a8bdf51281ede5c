"""Recording a benchmark run: a BenchRun with its environment, then one BenchResult per cell.

    with Recorder("bench_throughput", options) as rec:
        rec.add("append", "per-event", {"concurrency": 8}, throughput=..., unit="events/s",
                latencies_ms=samples, count=n, verified_rows=n)

A run that raises is recorded as failed with its error; results added before are kept.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from django.utils import timezone

from benchmarks import environment
from benchmarks.models import BenchResult, BenchRun
from benchmarks.stats import latency_summary
from journal import conf


class VerificationError(AssertionError):
    """What a benchmark wrote does not match the rows in the database."""


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class Recorder:
    def __init__(self, command: str, options: dict | None = None, using: str = "default"):
        self.command = command
        self.options = {k: v for k, v in (options or {}).items() if _jsonable(v)}
        self.using = using
        self.run: BenchRun | None = None
        self.results: list[BenchResult] = []
        self.skipped: list[tuple[str, str]] = []

    def __enter__(self) -> Recorder:
        loom = {name: _jsonish(conf.get_safe(name, None)) for name in conf.SETTINGS}
        self.run = BenchRun.objects.using(self.using).create(
            command=self.command,
            argv=environment.command_line(),
            settings={"options": self.options, "loom": loom},
            **environment.describe(self.using),
        )
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        assert self.run is not None
        self.run.finished_at = timezone.now()
        if exc is None:
            self.run.status = BenchRun.Status.OK
        else:
            self.run.status = BenchRun.Status.FAILED
            self.run.error = f"{exc_type.__name__}: {exc}"
        if self.skipped:
            self.run.settings = {**self.run.settings, "skipped": dict(self.skipped)}
        self.run.save(using=self.using)

    def add(self, section: str, scenario: str, params: dict | None = None, *, throughput: float | None = None,
            unit: str = "", latencies_ms: Sequence[float] | None = None, count: int | None = None,
            **metrics) -> BenchResult:
        """Record one cell. Latency percentiles are computed from the raw samples if given."""
        assert self.run is not None, "use Recorder as a context manager"
        summary = latency_summary(latencies_ms) if latencies_ms else {}
        for key in ("p50_ms", "p95_ms", "p99_ms", "max_ms"):
            if key in metrics:
                summary[key] = metrics.pop(key)
        result = BenchResult.objects.using(self.using).create(
            run=self.run,
            section=section,
            scenario=scenario,
            params=params or {},
            throughput=_clean(throughput),
            unit=unit,
            count=count,
            metrics={k: _clean(_jsonish(v)) for k, v in metrics.items()},
            **{k: _clean(v) for k, v in summary.items()},
        )
        self.results.append(result)
        return result

    def skip(self, section: str, reason: str) -> None:
        """A section that cannot run here (no PostgreSQL, say): said once, recorded on the run."""
        self.skipped.append((section, reason))


def _jsonable(value) -> bool:
    return isinstance(value, (str, int, float, bool, list, tuple, dict, type(None)))


def _jsonish(value):
    if isinstance(value, (str, int, float, bool, type(None))):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonish(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonish(v) for k, v in value.items()}
    return str(value)
