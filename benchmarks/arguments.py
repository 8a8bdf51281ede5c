"""Argument types every bench command shares, so that a bad count is refused while the command line is
parsed: before a `BenchRun` is recorded (`call_command` turns the error into a `CommandError`, the
command line into a usage message and exit status 2). A zero or negative count would otherwise run
nothing and be recorded as an "ok" run, and text where a number belongs would end in a traceback and
a FAILED run row.

    parser.add_argument("--ops", type=positive_int, default=400)
    parser.add_argument("--concurrency", type=positive_int_list, default=None)   # "1,8,32" -> [1, 8, 32]
"""

from __future__ import annotations

import argparse
import math


def _integer(text: str) -> int:
    try:
        return int(str(text).strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def positive_int(text: str) -> int:
    """A count of at least 1 (writers, operations, repeats)."""
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """A count where 0 means none (warm-up calls, payload padding)."""
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def non_negative_float(text: str) -> float:
    """A duration where 0 means none (effect milliseconds)."""
    try:
        value = float(str(text).strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of 0 or more, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """A duration that must be above 0 (seconds of a sustained run)."""
    value = non_negative_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text!r}")
    return value


def positive_int_list(text: str) -> list[int]:
    """Comma-separated counts, each at least 1: "1,8,32" -> [1, 8, 32]."""
    parts = [p for p in str(text).split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}")
    return [positive_int(p) for p in parts]


def choice_list(*allowed: str):
    """Comma-separated names out of `allowed`: "noop,io" -> ["noop", "io"]."""

    def parse(text: str) -> list[str]:
        values = [v.strip() for v in str(text).split(",") if v.strip()]
        if not values or any(v not in allowed for v in values):
            raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {', '.join(allowed)}, "
                                             f"got {text!r}")
        return values

    parse.__name__ = "list"
    return parse


def rate_list(text: str) -> list[str]:
    """Reaction latency scenarios: "idle" and/or commits per second (each at least 1)."""
    values = [v.strip() for v in str(text).split(",") if v.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"expected idle and/or commit rates, got {text!r}")
    return [v if v == "idle" else str(positive_int(v)) for v in values]
