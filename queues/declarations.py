"""Queue declarations: in settings (LOOM_QUEUES) or in code (declare_queue), checked at once.

A declaration is upserted into its queue's row (queues_queue) the first time a process enqueues to
it and when a loom_worker starts: the caps the dequeue enforces are the row's, the same for every
worker on every host. What this module keeps in memory is only what this process declared and which
rows it already wrote (a cache: losing it costs one upsert).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any

from journal.ids import id_problem
from queues.exceptions import InvalidQueue, UnknownQueue
from queues.store import store_for

MAX_NAME = 100
OPTIONS = ("concurrency", "partition_concurrency", "rate_limit", "rate_period")


def _cap(name: str, option: str, value: Any, optional: bool) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidQueue(f"queue {name!r}: {option} must be a whole number of at least 1, got {value!r}")
    if not 1 <= value <= 2**31 - 1:
        raise InvalidQueue(f"queue {name!r}: {option} must be at least 1 (and fit an integer column), got {value}")
    return value


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """A queue's caps: global concurrency, optional per-partition concurrency, optional rate limit
    (rate_limit starts per rate_period seconds, over a sliding window)."""

    name: str
    concurrency: int
    partition_concurrency: int | None = None
    rate_limit: int | None = None
    rate_period: float | None = None

    def __post_init__(self) -> None:
        name = self.name
        problem = id_problem(name) if isinstance(name, str) else "a queue name is a str"
        if problem is None and len(name) > MAX_NAME:
            problem = f"at most {MAX_NAME} characters"
        if problem is not None:
            raise InvalidQueue(f"queue name {name!r}: {problem}")
        _cap(name, "concurrency", self.concurrency, optional=False)
        _cap(name, "partition_concurrency", self.partition_concurrency, optional=True)
        _cap(name, "rate_limit", self.rate_limit, optional=True)
        period = self.rate_period
        if (self.rate_limit is None) != (period is None):
            raise InvalidQueue(f"queue {name!r}: rate_limit and rate_period go together")
        if period is not None and (isinstance(period, bool) or not isinstance(period, (int, float))
                                   or not math.isfinite(period) or not 0.001 <= period <= 86400 * 366):
            raise InvalidQueue(f"queue {name!r}: rate_period must be seconds between 0.001 and a year, got {period!r}")
        if period is not None:
            object.__setattr__(self, "rate_period", float(period))

    @classmethod
    def from_options(cls, name: Any, options: Any) -> QueueSpec:
        """A spec from LOOM_QUEUES' {"concurrency": ..., ...}; InvalidQueue for unknown or missing options."""
        if not isinstance(options, dict):
            raise InvalidQueue(f"queue {name!r}: its options are a dict, got {type(options).__name__}")
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise InvalidQueue(f"queue {name!r}: unknown option(s) {', '.join(map(str, unknown))}")
        if "concurrency" not in options:
            raise InvalidQueue(f"queue {name!r}: concurrency is required")
        return cls(name, **options)


_declared: dict[str, QueueSpec] = {}
_written: dict[tuple[str, str], QueueSpec] = {}  # (alias, name) -> the spec this process upserted
_lock = threading.Lock()


DEFAULT = "default"  # the queue that always exists


def declare_queue(name: str, concurrency: int, partition_concurrency: int | None = None,
                  rate_limit: int | None = None, rate_period: float | None = None) -> QueueSpec:
    """Declare a queue in code (a flows module, an AppConfig.ready()); InvalidQueue if unusable.
    LOOM_QUEUES wins over a code declaration of the same name."""
    spec = QueueSpec(name, concurrency, partition_concurrency, rate_limit, rate_period)
    with _lock:
        _declared[name] = spec
    return spec


def declared() -> dict[str, QueueSpec]:
    """Every queue this process declares: the `default` queue (LOOM_QUEUE_DEFAULT_CONCURRENCY: every door
    without a queue starts there, so caps apply everywhere), code declarations, then LOOM_QUEUES over them."""
    from queues import conf

    specs = {DEFAULT: QueueSpec(DEFAULT, conf.get("LOOM_QUEUE_DEFAULT_CONCURRENCY")), **_declared}
    for name, options in conf.get("LOOM_QUEUES").items():
        specs[name] = QueueSpec.from_options(name, options)
    return specs


def forget(name: str) -> None:
    """Drop a code declaration and the note of its row (tests)."""
    with _lock:
        _declared.pop(name, None)
        for key in [key for key in _written if key[1] == name]:
            del _written[key]


def ensure_queue(name: str, alias: str) -> QueueSpec | None:
    """Make sure the queue's row exists with this process's declaration (returned: the enqueue creates
    the row from it again if it went missing since); UnknownQueue if this process declares no such
    queue and the database has no row of that name (None: declared by another process)."""

    spec = declared().get(name) if isinstance(name, str) else None
    if spec is None:
        # Only a name a declaration could have (no NUL...) is looked up: any other is unknown as it is.
        if isinstance(name, str) and id_problem(name) is None and len(name) <= MAX_NAME \
                and store_for(alias).has_queue(name):
            return None  # declared by another process (its row is the truth)
        raise UnknownQueue(f"no queue named {name!r} is declared (LOOM_QUEUES or queues.declare_queue)")
    if _written.get((alias, name)) != spec:
        store_for(alias).upsert_queue(spec)
        with _lock:
            _written[(alias, name)] = spec
    return spec


def write_declared(alias: str) -> list[str]:
    """Upsert every declared queue's row (a loom_worker starting); the names written."""
    names = sorted(declared())
    for name in names:
        ensure_queue(name, alias)
    return names
