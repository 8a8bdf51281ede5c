"""Recording a benchmark run: a BenchRun with its environment, then one BenchResult per cell.

    with Recorder("bench_throughput", options) as rec:
        rec.add("append", "per-event", {"concurrency": 8}, throughput=..., unit="events/s",
                latencies_ms=samples, count=n, verified_rows=n)

A run that raises is recorded as failed with its error; results added before are kept.

Settings are recorded through an allow-list (RECORDED_SETTINGS): a LOOM_* setting not on it, or whose
name looks like a secret (journal/redaction.py), is stored as "<redacted>" (or as its empty value when
unset), because recorded runs are shown on the result pages and exported as JSON. Command options and
the command line get the same treatment for secret-looking option names (`--token`, `--password`...).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from django.utils import timezone

from benchmarks import environment
from benchmarks.models import BenchResult, BenchRun
from benchmarks.stats import latency_summary
from journal import conf
from journal.redaction import REDACTED, is_secret, redact, redact_tree

# The LOOM_* settings recorded in clear with each run: tuning knobs that explain a run's figures.
# A setting must be added here on purpose; anything else (LOOM_API_TOKENS, a setting added later) is
# recorded redacted.
RECORDED_SETTINGS = frozenset({
    "LOOM_MAX_PAYLOAD_BYTES", "LOOM_NOTIFY", "LOOM_NOTIFY_CHANNEL", "LOOM_SNAPSHOT_EVERY", "LOOM_COALESCE",
    "LOOM_COALESCE_MAX_BATCH", "LOOM_COALESCE_FLUSHERS", "LOOM_FLOW_MODULES", "LOOM_LEASE_MODE", "LOOM_LEASE_TTL",
    "LOOM_LEASE_RENEW_EVERY", "LOOM_LEASE_LAZY_GRACE", "LOOM_LEASE_CHUNK", "LOOM_RECOVERY_EVERY",
    "LOOM_RECOVERY_MAX_ATTEMPTS", "LOOM_RECOVERY_BATCH", "LOOM_WORKER_ID", "LOOM_WORKER_RETENTION",
    "LOOM_AGGREGATE_CACHE_SIZE",
    "LOOM_AGGREGATE_MODULES", "LOOM_DRAIN_LEASE_SECONDS", "LOOM_DRAIN_BATCH", "LOOM_DRAIN_STREAMS",
    "LOOM_DRAIN_RETRIES", "LOOM_DRAIN_POLL_MS", "LOOM_DRAIN_LISTEN", "LOOM_DRAIN_RETRY_DELAY",
    "LOOM_CORRELATE_HORIZON_SECONDS", "LOOM_CORRELATE_BATCH", "LOOM_PROJECTION_MODULES", "LOOM_API_AUTH",
    "LOOM_API_MAX_BODY_BYTES", "LOOM_API_EXAMPLES", "LOOM_API_CALL_TIMEOUT", "LOOM_API_MAX_WAIT",
    "LOOM_RESULTS_PUBLIC",
})


class VerificationError(AssertionError):
    """What a benchmark wrote does not match the rows in the database."""


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class Recorder:
    def __init__(self, command: str, options: dict | None = None, using: str = "default"):
        self.command = command
        self.options = redact_tree({k: v for k, v in (options or {}).items() if _jsonable(v)})
        self.using = using
        self.run: BenchRun | None = None
        self.results: list[BenchResult] = []
        self.skipped: list[tuple[str, str]] = []

    def __enter__(self) -> Recorder:
        self.run = BenchRun.objects.using(self.using).create(
            command=self.command,
            argv=redacted_command_line(environment.command_line()),
            settings={"options": self.options, "loom": recorded_settings()},
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


def recorded_settings() -> dict:
    """Every declared LOOM_* setting: in clear when allow-listed and not secret-looking, else redacted."""
    recorded = {}
    for name in conf.SETTINGS:
        value = _jsonish(conf.get_safe(name, None))
        recorded[name] = value if name in RECORDED_SETTINGS and not is_secret(name) else redact(value)
    return recorded


def scrub_settings(recorded: dict) -> dict:
    """A run's `settings` document with the same rules applied again: for runs recorded before the
    allow-list existed (migration 0002 rewrites them) and as a last guard before a page shows one."""
    scrubbed = dict(recorded)
    if isinstance(recorded.get("loom"), dict):
        scrubbed["loom"] = {name: value if name in RECORDED_SETTINGS and not is_secret(name) else redact(value)
                            for name, value in recorded["loom"].items()}
    if isinstance(recorded.get("options"), dict):
        scrubbed["options"] = redact_tree(recorded["options"])
    return scrubbed


def redacted_command_line(argv: str) -> str:
    """The command line with the value of every secret-looking option replaced (`--token=x`, `--token x`)."""
    words = argv.split(" ")
    for i, word in enumerate(words):
        if not word.startswith("-"):
            continue
        name, eq, _ = word.partition("=")
        if not is_secret(name):
            continue
        if eq:
            words[i] = f"{name}={REDACTED}"
        elif i + 1 < len(words) and not words[i + 1].startswith("-"):
            words[i + 1] = REDACTED
    return " ".join(words)


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
