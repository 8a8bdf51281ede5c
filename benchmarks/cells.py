"""A measured cell's prologue and verify tail, shared by every bench section.

Every cell does the same around its timed work: open the streams it writes to (outside the timed
window), drive N workers with a progress bar, fail loudly on any worker error, then check what the
workers reported against the rows in the database (count, no gaps) and remove its streams unless
--keep. Written once here, a section keeps only what it measures.
"""

from __future__ import annotations

from collections.abc import Callable

from benchmarks import streams
from benchmarks.harness import Outcome, run_workers
from journal.envelopes import Envelope
from journal.models import Event


def open_streams(pfx: str, count: int, kind: str = "BenchOpened") -> list[str]:
    """Streams `pfx0..pfx{count-1}`, each opened with one event, so the timed appends guard a known tip."""
    ids = [f"{pfx}{w}" for w in range(count)]
    for sid in ids:
        Event.objects.open_stream(sid, Envelope(kind))
    return ids


def drive(ctx, label: str, concurrency: int, ops: int, op: Callable[[int, int], int], *, total: int | None = None,
          per_call: int = 1, setup=None, teardown=None) -> Outcome:
    """Run `op` on `concurrency` workers, `ops` calls each, with a progress bar; raise on any worker error.

    `per_call` is how many units one call writes (the bar counts units); `total` overrides the bar's size."""
    bar = ctx.progress(total if total is not None else concurrency * ops * per_call, label)
    outcome = run_workers(concurrency, ops, op, setup=setup, teardown=teardown,
                          progress=lambda n: bar.update(n * per_call))
    bar.close()
    raise_errors(f"{ctx.section} {label}", outcome.errors)
    return outcome


def raise_errors(label: str, errors: list[str]) -> None:
    """A cell whose workers failed is not a figure: stop the run with the first errors."""
    if errors:
        raise RuntimeError(f"{label}: {errors[:3]}")


def verify_written(ctx, label: str, pfx: str, expected: int, opened: int = 0) -> int:
    """Check the events under `pfx` (minus the `opened` opening events) against what the workers reported,
    and that no stream has a gap; the count written."""
    written = streams.count_events(pfx) - opened
    ctx.verify(f"{label} events", expected, written)
    ctx.verify(f"{label} streams with gaps", 0, streams.check_contiguous(pfx))
    return written


def tidy(ctx, pfx: str) -> None:
    """Remove a cell's streams, unless the run was asked to --keep them."""
    if not ctx.options.get("keep"):
        streams.remove(pfx)
