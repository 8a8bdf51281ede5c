"""The settings the benchmarks app owns, registered with the journal's registry (journal/conf.py).

Imported by `BenchmarksConfig.ready()`; read them with `conf.get(name)` from either module.
"""

from __future__ import annotations

from journal.conf import Setting, get, get_safe, register

__all__ = ["get", "get_safe"]

register(
    "benchmarks",
    Setting("LOOM_RESULTS_PUBLIC", bool, False,
            "Benchmark result pages need no login (default: staff only; runs name machines and commits)."),
    Setting("LOOM_RESULTS_URL", str, "",
            "Scheme and host the bench commands put before a run's page path in the link they print "
            "(e.g. https://ops.example.com; empty: the path alone, to open on your site)."),
)
