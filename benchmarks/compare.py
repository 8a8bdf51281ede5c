"""Comparing recorded cells across runs, and the absolute-baseline check built on that comparison.

A *cell* is one measured figure set, identified across runs by its section, scenario and parameters
(`append/per-event[concurrency=1,events_per_call=1,payload_bytes=256]`). Comparing two runs pairs their
cells by that key; a ratio per figure says how the newer run moved (throughput: higher is better; p50 and
p99: lower is better). A cell is flagged as a regression (or an improvement) only when its p50 grew
(fell), or its throughput fell (rose), by more than the threshold AND outside the measured spread of
repeats: every repeat of the new run worse (better) than every repeat of the base run. Two identical
runs of a noisy cell differ by 2x on a shared machine; a difference inside that spread, or a cell whose
runs measured no spread (a single repeat), is "noise": not judged either way.

`manage.py bench_check` applies the threshold to a few chosen cells' p50s only, against a baseline file
or run taken on the same machine (see `GATED` for which cells and why); CI gates ratios within one run
instead (benchmarks/gate.py, `bench_gate`). Nothing here touches Django beyond reading
model instances, so the rules can be read and tested on their own.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

#: p50 more than this many times its baseline fails the gate; the compare page uses it by default too.
DEFAULT_FACTOR = 1.5
BASELINE_FORMAT = 1


def cell_key(section: str, scenario: str, params: Mapping[str, Any]) -> str:
    """Identity of a cell across runs (the same string as `BenchResult.key`)."""
    inner = ",".join(f"{k}={params[k]}" for k in sorted(params))
    return f"{section}/{scenario}[{inner}]"


@dataclass(frozen=True)
class Cell:
    """The figures of one recorded cell, detached from the database."""

    section: str
    scenario: str
    params: dict = field(default_factory=dict)
    throughput: float | None = None
    unit: str = ""
    p50_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    max_ms: float | None = None
    count: int | None = None
    throughput_runs: tuple[float, ...] = ()  # one throughput per repeat (the spread); () if not measured
    p50_runs: tuple[float, ...] = ()  # one p50 per repeat

    @property
    def key(self) -> str:
        return cell_key(self.section, self.scenario, self.params)

    @classmethod
    def from_result(cls, result) -> Cell:
        """From a `BenchResult` (or anything with the same attributes). The spread of repeats is read
        from the metrics sections record it under: `runs` (throughput per repeat; the lease section's
        `samples`) and `p50_runs`."""
        metrics = getattr(result, "metrics", None) or {}
        return cls(result.section, result.scenario, dict(result.params or {}), result.throughput, result.unit,
                   result.p50_ms, result.p95_ms, result.p99_ms, result.max_ms, result.count,
                   _numbers(metrics.get("runs") or metrics.get("samples")), _numbers(metrics.get("p50_runs")))


def _numbers(values) -> tuple[float, ...]:
    if not isinstance(values, (list, tuple)):
        return ()
    return tuple(float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool))


def _ratio(new: float | None, base: float | None) -> float | None:
    if new is None or base is None or base <= 0:
        return None
    return new / base


@dataclass(frozen=True)
class Row:
    """One line of a comparison: a cell in the base run, the new run, or both, and how it moved."""

    key: str
    base: Cell | None
    new: Cell | None
    throughput_ratio: float | None  # new / base: above 1 is faster (higher is better)
    p50_ratio: float | None  # new / base: above 1 is slower (lower is better)
    p99_ratio: float | None  # new / base: lower is better
    status: str  # regression, improvement, noise, same, added, removed
    note: str = ""  # why a status is what it is (the spreads, for noise)

    @property
    def cell(self) -> Cell:
        return self.new or self.base  # type: ignore[return-value]


def classify(throughput_ratio: float | None, p50_ratio: float | None, factor: float) -> str:
    """Regression when p50 grew past `factor` or throughput fell below 1/`factor`; worse wins over better."""
    if (p50_ratio is not None and p50_ratio > factor) or (
            throughput_ratio is not None and throughput_ratio < 1 / factor):
        return "regression"
    if (p50_ratio is not None and p50_ratio < 1 / factor) or (
            throughput_ratio is not None and throughput_ratio > factor):
        return "improvement"
    return "same"


def _separated(base: tuple[float, ...], new: tuple[float, ...], worse_if_higher: bool, verdict: str) -> bool:
    """Whether every new repeat lies beyond every base repeat in the direction of `verdict`."""
    if len(base) < 2 or len(new) < 2:
        return False
    higher = min(new) > max(base)
    lower = max(new) < min(base)
    if verdict == "regression":
        return higher if worse_if_higher else lower
    return lower if worse_if_higher else higher


def judge(old: Cell, new: Cell, factor: float) -> tuple[str, str]:
    """(status, note) of a paired cell: each figure past the threshold is confirmed against the spread
    of its repeats; a regression wins over an improvement; unconfirmed differences are noise."""
    tr, p50 = _ratio(new.throughput, old.throughput), _ratio(new.p50_ms, old.p50_ms)
    confirmed: list[str] = []
    unconfirmed: list[str] = []
    for name, ratio, base_runs, new_runs, worse_if_higher in (
            ("throughput", tr, old.throughput_runs, new.throughput_runs, False),
            ("p50", p50, old.p50_runs, new.p50_runs, True)):
        if ratio is None:
            continue
        verdict = (classify(ratio, None, factor) if name == "throughput" else classify(None, ratio, factor))
        if verdict == "same":
            continue
        if _separated(base_runs, new_runs, worse_if_higher, verdict):
            confirmed.append(verdict)
        elif len(base_runs) < 2 or len(new_runs) < 2:
            unconfirmed.append(f"{name} {ratio:.2f}x, but no spread of repeats was measured (one repeat): not judged")
        else:
            unconfirmed.append(f"{name} {ratio:.2f}x is within the spread of repeats (base {_span(base_runs)}, "
                               f"new {_span(new_runs)})")
    if "regression" in confirmed:
        return "regression", ""
    if "improvement" in confirmed:
        return "improvement", ""
    if unconfirmed:
        return "noise", "; ".join(unconfirmed)
    return "same", ""


def _span(values: tuple[float, ...]) -> str:
    return f"{min(values):.4g}..{max(values):.4g}"


def compare(base: Iterable[Cell], new: Iterable[Cell], factor: float = DEFAULT_FACTOR) -> list[Row]:
    """Pair cells by key; rows in the new run's order, then cells only the base run has."""
    base_by_key = {c.key: c for c in base}
    rows: list[Row] = []
    seen: set[str] = set()
    for cell in new:
        if cell.key in seen:
            continue
        seen.add(cell.key)
        old = base_by_key.get(cell.key)
        if old is None:
            rows.append(Row(cell.key, None, cell, None, None, None, "added"))
            continue
        tr = _ratio(cell.throughput, old.throughput)
        p50 = _ratio(cell.p50_ms, old.p50_ms)
        status, note = judge(old, cell, factor)
        rows.append(Row(cell.key, old, cell, tr, p50, _ratio(cell.p99_ms, old.p99_ms), status, note))
    for key, old in base_by_key.items():
        if key not in seen:
            rows.append(Row(key, old, None, None, None, None, "removed"))
    return rows


# --- the CI gate -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GateRule:
    """Cells of `section`/`scenario` whose params include `params` are gated."""

    section: str
    scenario: str
    params: dict
    why: str

    def matches(self, cell: Cell) -> bool:
        return (cell.section == self.section and cell.scenario == self.scenario
                and all(cell.params.get(k) == v for k, v in self.params.items()))


#: The gated cells. Only single-writer cells: with one writer there is no lock wait, no scheduler
#: contention between writer threads and no group-commit luck, so the median of a few hundred calls
#: moves only when the code path moves. Cells at concurrency > 1 swing by 2x between runs on a
#: shared 2-core CI runner (see any two runs' compare page); gating them would make CI flaky.
#: The raw `ceiling` cell is not gated: it measures the database and driver, not our code; the
#: gate prints it beside a failure so a slower machine is recognisable.
GATED: tuple[GateRule, ...] = (
    GateRule("append", "per-event", {"concurrency": 1},
             "one fenced append per call, one writer: the journal's hot path with nothing else in it"),
    GateRule("append", "batch", {"concurrency": 1},
             "append_batch of 16 rows, one writer: the multi-row statement and its per-row guard"),
)

#: Cells shown next to a gate failure, to tell a slower machine from slower code.
CONTROLS: tuple[GateRule, ...] = (
    GateRule("append", "ceiling", {"concurrency": 1}, "raw psycopg/sqlite3 statement, no Django"),
)


def is_gated(cell: Cell, rules: Iterable[GateRule] = GATED) -> bool:
    return any(rule.matches(cell) for rule in rules)


@dataclass(frozen=True)
class GateOutcome:
    key: str
    baseline_p50_ms: float
    current_p50_ms: float | None  # None: the cell was not measured
    factor: float

    @property
    def ratio(self) -> float | None:
        return _ratio(self.current_p50_ms, self.baseline_p50_ms)

    @property
    def failed(self) -> bool:
        """A gated cell fails when it was not measured (a gate that skips silently guards nothing)
        or its p50 is more than `factor` times its baseline."""
        ratio = self.ratio
        return ratio is None or ratio > self.factor


def best_p50(runs_cells: Iterable[Iterable[Cell]]) -> dict[str, Cell]:
    """Per key, the cell with the lowest p50 over several runs: noise only ever slows a run down,
    so the best of N repeats is the steadiest estimate of what the code costs."""
    best: dict[str, Cell] = {}
    for cells in runs_cells:
        for cell in cells:
            if cell.p50_ms is None:
                continue
            if cell.key not in best or cell.p50_ms < best[cell.key].p50_ms:  # type: ignore[operator]
                best[cell.key] = cell
    return best


def gate(baseline: Mapping[str, float], current: Mapping[str, Cell],
         factor: float = DEFAULT_FACTOR) -> list[GateOutcome]:
    """Check every baselined cell (key -> p50 ms) against the current cells."""
    outcomes = []
    for key in sorted(baseline):
        cell = current.get(key)
        outcomes.append(GateOutcome(key, baseline[key], cell.p50_ms if cell else None, factor))
    return outcomes


# --- the baseline file -------------------------------------------------------------------------------


class BaselineError(ValueError):
    """The baseline file is missing, unreadable, or has no entry for this database."""


@dataclass(frozen=True)
class Baseline:
    """Gated p50s for one database vendor, and where they were measured."""

    vendor: str
    cells: dict[str, float]  # key -> p50 ms
    run_id: int | None = None
    commit: str = ""
    machine: str = ""
    recorded_at: str = ""
    factor: float = DEFAULT_FACTOR


def read_baseline(path: Path, vendor: str) -> Baseline:
    """The vendor's entry of a baseline file (one file holds one entry per database vendor)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise BaselineError(f"baseline file {path} does not exist (create it with bench_check --update)") from None
    except (OSError, ValueError) as exc:
        raise BaselineError(f"baseline file {path} is not readable JSON: {exc}") from None
    if data.get("format") != BASELINE_FORMAT:
        raise BaselineError(f"baseline file {path} has format {data.get('format')!r}, expected {BASELINE_FORMAT}")
    entry = data.get("baselines", {}).get(vendor)
    if not entry or not entry.get("cells"):
        raise BaselineError(f"baseline file {path} has no cells for {vendor} (add them with bench_check --update)")
    return Baseline(vendor, {k: float(v["p50_ms"]) for k, v in entry["cells"].items()}, entry.get("run"),
                    entry.get("commit", ""), entry.get("machine", ""), entry.get("recorded_at", ""),
                    float(data.get("factor", DEFAULT_FACTOR)))


def write_baseline(path: Path, baseline: Baseline) -> None:
    """Replace the vendor's entry of the file, keeping the other vendors' entries."""
    data: dict[str, Any] = {"format": BASELINE_FORMAT, "factor": baseline.factor, "baselines": {}}
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except ValueError:
            old = {}
        if old.get("format") == BASELINE_FORMAT:
            data["baselines"] = old.get("baselines", {})
    entry = asdict(baseline)
    entry.pop("vendor")
    entry.pop("factor")
    entry["run"] = entry.pop("run_id")
    entry["cells"] = {k: {"p50_ms": round(v, 4)} for k, v in sorted(baseline.cells.items())}
    data["baselines"][baseline.vendor] = entry
    data["baselines"] = dict(sorted(data["baselines"].items()))
    path.write_text(json.dumps(data, indent=2) + "\n")
