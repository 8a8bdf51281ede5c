"""Small statistics for benchmarks: percentiles, medians, throughput."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def percentile(sorted_samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted samples (q in 0..100)."""
    if not sorted_samples:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(sorted_samples)))
    return sorted_samples[rank - 1]


def latency_summary(samples_ms: Sequence[float]) -> dict[str, float]:
    """p50/p95/p99/max of latency samples in milliseconds."""
    ordered = sorted(samples_ms)
    return {
        "p50_ms": percentile(ordered, 50),
        "p95_ms": percentile(ordered, 95),
        "p99_ms": percentile(ordered, 99),
        "max_ms": ordered[-1] if ordered else math.nan,
    }


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan
