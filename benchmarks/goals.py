"""The goals the figures are held to, each computed from the cells of one recorded run.

A goal names the entry of the docs plan whose run measures it (benchmarks/docs_plan.py), and reads
that run's cells: what it measured (text with the figures) and a verdict, `met`, `not met` or
`not measured` (the cells are missing, at another size than the goal's, or their repeats spread wider
than the effect). Nothing here is a literal result: change a figure and the verdict follows.

Where the goals come from: the issues named beside each (docs/benchmarks.md kept the list), and the
reference documents in /work/shared/seeds (the Loom runtime's append/coalescing/lease figures, Act's
reaction latency, replay and lanes, Lun's HTTP calls), whose absolute numbers were taken on 8-16 core
machines: those goals say "reference" and compare like with like only as orientation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

MET, NOT_MET, NOT_MEASURED = "met", "not met", "not measured"


@dataclass(frozen=True)
class Verdict:
    measured: str
    verdict: str


@dataclass(frozen=True)
class Goal:
    name: str
    source: str  # the issue or reference document that set it
    entry: str  # the docs plan entry whose run measures it
    evaluate: Callable[[Sequence], Verdict]


def cells_of(results: Iterable, section: str, scenario: str | None = None, **params) -> list:
    """The cells of `section` (and `scenario`) whose params include every given key=value."""
    return [r for r in results if r.section == section and (scenario is None or r.scenario == scenario)
            and all(r.params.get(k) == v for k, v in params.items())]


def _x(value: float) -> str:
    return f"{value:.2f}x"


def _sizes(cells: Sequence, key: str) -> list:
    return sorted({c.params.get(key) for c in cells if c.params.get(key) is not None})


def _missing(what: str, present: list, key: str) -> Verdict:
    found = f"measured at {key} {', '.join(map(str, present))} only" if present else "no cell in the run"
    return Verdict(f"{what}: {found}", NOT_MEASURED)


# -- append and coalescing (issue 7; reference: the Loom runtime) -------------------------------------
def append_overhead(results: Sequence, limit: float = 1.25, sizes: tuple[int, ...] = (1, 8, 32)) -> Verdict:
    """ceiling / per-event throughput (medians of interleaved repeats) at each writer count."""
    ratios = {}
    for conc in _sizes(cells_of(results, "append"), "concurrency"):
        ours = cells_of(results, "append", "per-event", concurrency=conc)
        ceiling = cells_of(results, "append", "ceiling", concurrency=conc)
        if ours and ceiling and ours[0].throughput:
            ratios[conc] = ceiling[0].throughput / ours[0].throughput
    wanted = [c for c in sizes if c in ratios]
    if not wanted:
        return _missing("ceiling/ours", sorted(ratios), "concurrency")
    text = ", ".join(f"{_x(ratios[c])} at {c}" for c in wanted)
    over = [c for c in wanted if ratios[c] > limit]
    verdict = NOT_MET if over else MET
    if not over and len(wanted) < len(sizes):
        verdict = NOT_MEASURED
    return Verdict(f"ceiling/ours = {text} writers" + (f" (over at {over})" if over else ""), verdict)


def _at_writers(results: Sequence, writers: int = 64) -> tuple[list, Verdict | None]:
    cells = cells_of(results, "coalesced", writers=writers)
    if not cells:
        return [], _missing("coalesced", _sizes(cells_of(results, "coalesced"), "writers"), "writers")
    return cells, None


def coalescing_gain(results: Sequence, at_least: float = 4.0) -> Verdict:
    cells, missing = _at_writers(results)
    if missing:
        return missing
    gains = {c.scenario: c.metrics.get("vs_per_event") for c in cells if c.scenario.startswith("coalesced-")}
    gains = {k: v for k, v in gains.items() if v is not None}
    if not gains:
        return Verdict("no coalesced cell with vs_per_event", NOT_MEASURED)
    text = ", ".join(f"{k} {_x(v)}" for k, v in sorted(gains.items()))
    return Verdict(f"{text} per-event", MET if all(v >= at_least for v in gains.values()) else NOT_MET)


def coalesced_over_ceiling(results: Sequence) -> Verdict:
    cells, missing = _at_writers(results)
    if missing:
        return missing
    ceiling = next((c.throughput for c in cells if c.scenario == "ceiling"), None)
    ours = {c.scenario: c.throughput for c in cells if c.scenario.startswith("coalesced-") and c.throughput}
    if not ceiling or not ours:
        return Verdict("no ceiling or coalesced cell at 64 writers", NOT_MEASURED)
    text = " / ".join(f"{v:,.0f}" for _, v in sorted(ours.items()))
    return Verdict(f"{text} events/s vs ceiling {ceiling:,.0f}", MET if min(ours.values()) > ceiling else NOT_MET)


# -- the write path at its ceilings (issue 16) --------------------------------------------------------
def over_raw_coalescer(results: Sequence, at_least: float = 1.0) -> Verdict:
    """Our coalesced cells at 64 writers over the raw-psycopg coalescer of the same run (vs_raw_coalescer)."""
    cells, missing = _at_writers(results)
    if missing:
        return missing
    ratios = {c.scenario: c.metrics.get("vs_raw_coalescer") for c in cells if c.scenario.startswith("coalesced-")}
    ratios = {k: v for k, v in ratios.items() if v is not None}
    if not ratios:
        return Verdict("no coalesced cell with vs_raw_coalescer (no raw-coalescer row)", NOT_MEASURED)
    text = ", ".join(f"{k} {_x(v)}" for k, v in sorted(ratios.items()))
    return Verdict(f"{text} the raw coalescer", MET if max(ratios.values()) >= at_least else NOT_MET)


def lone_writer(results: Sequence, at_least: float = 0.95) -> Verdict:
    """A single writer through the coalescer over a direct per-event append, same run."""
    cells = cells_of(results, "coalesced", "coalesced-16", writers=1)
    ratio = cells[0].metrics.get("vs_per_event") if cells else None
    if ratio is None:
        return Verdict("no single-writer coalesced cell", NOT_MEASURED)
    return Verdict(f"{_x(ratio)} a direct append", MET if ratio >= at_least else NOT_MET)


def versus_minimal(scenario: str, at_most: float) -> Callable[[Sequence], Verdict]:
    """minimal / ours at 1 writer (the append section's `minimal` row) within `at_most`."""
    def evaluate(results: Sequence) -> Verdict:
        cells = cells_of(results, "append", scenario, concurrency=1)
        ratio = cells[0].metrics.get("vs_minimal") if cells else None
        if not ratio:
            return Verdict(f"no {scenario} cell with vs_minimal at 1 writer", NOT_MEASURED)
        return Verdict(f"minimal/{scenario} = {_x(1 / ratio)} at 1 writer", MET if 1 / ratio <= at_most else NOT_MET)
    return evaluate


def default_is_best(results: Sequence, conc: int = 64, at_least: float = 0.9) -> Verdict:
    """Durable 1-step at 64 concurrent: the default settings against the best configuration, same run."""
    cells = cells_of(results, "durable", "1-step", concurrency=conc)
    by_config: dict[str, list[float]] = {}
    for c in cells:
        by_config.setdefault(c.params.get("config") or ("on" if c.params.get("coalesce") else "off"),
                             []).append(c.throughput or 0.0)
    if "default" not in by_config or len(by_config) < 2:
        return Verdict("no default cell beside off/on at 64 concurrent", NOT_MEASURED)
    best = {k: max(v) for k, v in by_config.items()}
    text = ", ".join(f"{k} {v:,.0f}" for k, v in sorted(best.items()))
    return Verdict(f"{text} exec/s", MET if best["default"] >= at_least * max(best.values()) else NOT_MET)


def growth_flat(results: Sequence, at_most: float = 1.3) -> Verdict:
    """Per-op cost at the largest journal size over the smallest (growth_ratio), every operation."""
    ratios = {c.scenario: c.metrics.get("growth_ratio") for c in cells_of(results, "growth")}
    ratios = {k: v for k, v in ratios.items() if v is not None}
    if not ratios:
        return Verdict("no growth cell with growth_ratio", NOT_MEASURED)
    over = sorted(k for k, v in ratios.items() if v > at_most)
    text = ", ".join(f"{k} {_x(v)}" for k, v in sorted(ratios.items()))
    return Verdict(text + (f" (over: {', '.join(over)})" if over else ""), NOT_MET if over else MET)


# -- the write path past the GIL (issue 33) -----------------------------------------------------------
def _vendor(results: Sequence) -> str | None:
    """The database of the run the cells come from (BenchResult rows know their run; plain cells do not)."""
    run = getattr(results[0], "run", None) if results else None
    return getattr(run, "db_vendor", None)


def sqlite_versus_minimal(at_least: float = 0.5) -> Callable[[Sequence], Verdict]:
    """SQLite, the embedded default: per-event over the minimal sqlite3 statement at 1 writer (vs_minimal)."""
    def evaluate(results: Sequence) -> Verdict:
        vendor = _vendor(results)
        if vendor is not None and vendor != "sqlite":
            return Verdict(f"a goal of the SQLite run (this run is on {vendor})", NOT_MEASURED)
        cells = cells_of(results, "append", "per-event", concurrency=1)
        ratio = cells[0].metrics.get("vs_minimal") if cells else None
        if not ratio:
            return Verdict("no per-event cell with vs_minimal at 1 writer", NOT_MEASURED)
        return Verdict(f"per-event/minimal = {_x(ratio)} at 1 writer", MET if ratio >= at_least else NOT_MET)
    return evaluate


def durable_default_rate(results: Sequence, conc: int = 64, at_least: float = 5000.0) -> Verdict:
    """Durable 1-step executions at 64 concurrent with the default settings (config=default)."""
    cells = [c for c in cells_of(results, "durable", "1-step", concurrency=conc)
             if (c.params.get("config") or "default") == "default"]
    if not cells or not cells[0].throughput:
        return Verdict(f"no default 1-step cell at {conc} concurrent", NOT_MEASURED)
    rate = max(c.throughput for c in cells)
    return Verdict(f"{rate:,.0f} exec/s (default settings)", MET if rate >= at_least else NOT_MET)


def peer_ratio_at_least(peer: str, at_least: float) -> Callable[[Sequence], Verdict]:
    """Ours over a peer (vs_<peer> of the peers section) at every concurrency, at least `at_least`."""
    key = f"vs_{peer.lower()}"

    def evaluate(results: Sequence) -> Verdict:
        ratios = {c.params.get("concurrency"): c.metrics.get(key) for c in cells_of(results, "peers")
                  if c.params.get("peer", "").lower() == peer.lower() and c.metrics.get(key) is not None}
        if not ratios:
            return Verdict(f"no {peer} cells (PostgreSQL with the `peers` extra only)", NOT_MEASURED)
        text = ", ".join(f"{_x(v)} at {k}" for k, v in sorted(ratios.items()))
        return Verdict(f"ours / {peer}: {text} callers", MET if min(ratios.values()) >= at_least else NOT_MET)
    return evaluate


# -- durable flows, transient calls, reads (issue 3, 7, 15) -------------------------------------------
def durable_rate(results: Sequence, conc: int = 64, at_least: float = 1500.0) -> Verdict:
    cells = cells_of(results, "durable", "1-step", concurrency=conc)
    if not cells:
        return _missing("1-step", _sizes(cells_of(results, "durable", "1-step"), "concurrency"), "concurrency")
    by_mode = {("with" if c.params.get("coalesce") else "without") + " LOOM_COALESCE": c.throughput or 0.0
               for c in cells}
    text = ", ".join(f"{v:,.0f} exec/s {k}" for k, v in by_mode.items())
    return Verdict(text, MET if max(by_mode.values()) >= at_least else NOT_MET)


def transient_rate(results: Sequence, at_least: float = 100_000.0) -> Verdict:
    cells = cells_of(results, "transient", "invoke_transient")
    if not cells or not cells[0].throughput:
        return Verdict("no invoke_transient cell", NOT_MEASURED)
    rows = cells[0].metrics.get("rows_written")
    return Verdict(f"{cells[0].throughput:,.0f} calls/s, {rows} rows written",
                   MET if cells[0].throughput >= at_least and rows == 0 else NOT_MET)


def read_ratio(results: Sequence, at_most: float = 1.3) -> Verdict:
    cells = cells_of(results, "read", "long/short p50")
    ratio = cells[0].metrics.get("ratio") if cells else None
    if ratio is None:
        return Verdict("no long/short cell of running executions", NOT_MEASURED)
    long = cells_of(results, "read", f"{cells[0].params.get('long')}-event")
    detail = ""
    if long:
        m = long[0].metrics
        detail = f"; the long load reads {m.get('rows_per_read')} rows in {m.get('queries_per_read')} statements"
    return Verdict(f"p50 ratio {_x(ratio)} (running executions{detail})", MET if ratio <= at_most else NOT_MET)


# -- leases (issue 4, 15) --------------------------------------------------------------------------------
def lease_overhead(mode: str, at_most: float) -> Callable[[Sequence], Verdict]:
    def evaluate(results: Sequence) -> Verdict:
        cells = [c for c in cells_of(results, "lease") if c.params.get("mode") == mode
                 and c.params.get("shape") == "noop"]
        if not cells:
            return Verdict(f"no {mode}/noop cell", NOT_MEASURED)
        measured = {c.scenario + f" c={c.params.get('concurrency')}": c.metrics.get("overhead_pct") for c in cells}
        wide = sorted(k for k, v in measured.items() if v is None)
        known = {k: v for k, v in measured.items() if v is not None}
        text = ", ".join(f"{k} {v:+.1f} %" for k, v in sorted(known.items()))
        if wide:
            text += ("; " if text else "") + f"spread too wide: {', '.join(wide)}"
        if any(v > at_most for v in known.values()):
            return Verdict(text, NOT_MET)
        return Verdict(text, NOT_MEASURED if wide else MET)
    return evaluate


# -- reactions (issue 6; reference: Act) -------------------------------------------------------------------
def reaction_latency(results: Sequence, rate: int = 1000, below_ms: float = 50.0) -> Verdict:
    cells = cells_of(results, "latency", f"latency {rate}")
    if not cells or cells[0].p50_ms is None:
        rates = [c.params.get("rate") for c in cells_of(results, "latency")]
        return Verdict(f"no cell at {rate} commits/s (measured: {rates})", NOT_MEASURED)
    c = cells[0]
    return Verdict(f"p50 {c.p50_ms:.1f} ms, p99 {c.p99_ms:.1f} ms at {c.throughput:,.0f} commits/s",
                   MET if c.p50_ms < below_ms else NOT_MET)


def replay_gain(results: Sequence, at_least: float = 19.0) -> Verdict:
    gains = {}
    for events in _sizes(cells_of(results, "replay"), "events"):
        batch = cells_of(results, "replay", "replay batch", events=events)
        each = cells_of(results, "replay", "replay per-event, one transaction each", events=events)
        if batch and each and each[0].throughput:
            gains[events] = batch[0].throughput / each[0].throughput
    if not gains:
        return Verdict("no replay cells", NOT_MEASURED)
    text = ", ".join(f"{_x(v)} at {k} events" for k, v in gains.items())
    return Verdict(f"batch / one transaction per event: {text}", MET if min(gains.values()) >= at_least else NOT_MET)


def fast_lane(results: Sequence, at_most_ms: float = 17.0) -> Verdict:
    one = cells_of(results, "lanes", "fast lane, one lane")
    two = cells_of(results, "lanes", "fast lane, two lanes")
    if not one or not two or two[0].p50_ms is None:
        return Verdict("no lanes cells", NOT_MEASURED)
    return Verdict(f"p50 {one[0].p50_ms:.1f} → {two[0].p50_ms:.1f} ms (one lane → two)",
                   MET if two[0].p50_ms <= at_most_ms else NOT_MET)


# -- HTTP (issue 8; reference: Lun) ------------------------------------------------------------------------
def http_rate(results: Sequence, at_least: float = 650.0) -> Verdict:
    cells = cells_of(results, "http", "fresh")
    by_conc = {c.params.get("concurrency"): c for c in cells}
    if 1 not in by_conc:
        return Verdict("no fresh cell at 1 client", NOT_MEASURED)
    errors = sum(c.metrics.get("errors") or 0 for c in cells)
    text = ", ".join(f"{c.throughput:,.0f} QPS at {k}" for k, c in sorted(by_conc.items()))
    return Verdict(f"{text} (p50 {by_conc[1].p50_ms:.2f} ms at 1), {errors} errors",
                   MET if by_conc[1].throughput >= at_least and errors == 0 else NOT_MET)


# -- peers (issue 15) ----------------------------------------------------------------------------------------
def peer_ratio(peer: str) -> Callable[[Sequence], Verdict]:
    """Ours at least as fast as the peer at every concurrency."""
    return peer_ratio_at_least(peer, 1.0)


# -- the ratio gate (issue 15) --------------------------------------------------------------------------------
def gate_rule(rule_name: str, goal_at_least: float | None = None) -> Callable[[Sequence], Verdict]:
    """A rule of benchmarks/gate.py as recorded by bench_gate; `goal_at_least` holds the ratio to the
    issue's goal where the gate's limit is looser than the goal."""
    def evaluate(results: Sequence) -> Verdict:
        cells = cells_of(results, "gate", rule_name)
        if not cells:
            return Verdict(f"rule {rule_name!r} not in the run (its rules are set for PostgreSQL)", NOT_MEASURED)
        if cells[0].metrics.get("ratio") is None:
            return Verdict(f"no ratio: the rule's cells were not measured (gate: {cells[0].metrics.get('verdict')})",
                           NOT_MEASURED)
        m = cells[0].metrics
        text = f"median paired ratio {m['ratio']:.3f} (gate {m.get('limit')}: {m.get('verdict')})"
        if goal_at_least is not None:
            return Verdict(text, MET if m["ratio"] >= goal_at_least else NOT_MET)
        if m.get("verdict") == "inconclusive":
            return Verdict(text, NOT_MEASURED)
        return Verdict(text, MET if m.get("passed") else NOT_MET)
    return evaluate


GOALS: tuple[Goal, ...] = (
    Goal("per-event append within 1.25x of the raw driver statement at 1, 8, 32 writers", "issue 7; Loom reference",
         "append-interleaved", append_overhead),
    Goal("coalesced appends at 64 writers ≥ 4x per-event", "issue 7", "throughput", coalescing_gain),
    Goal("coalesced appends above the raw one-row-per-transaction ceiling at 64 writers", "issue 7",
         "throughput", coalesced_over_ceiling),
    Goal("durable 1-step executions at 64 concurrent ≥ 1,500 exec/s", "issue 7", "throughput", durable_rate),
    Goal("coalesced appends at 64 writers ≥ 1.0x a raw-psycopg coalescer", "issue 16", "throughput",
         over_raw_coalescer),
    Goal("a lone writer through the coalescer ≥ 0.95x a direct append", "issue 16", "throughput", lone_writer),
    Goal("per-event append at 1 writer ≤ 1.5x the minimal fenced INSERT + notify", "issue 16", "throughput",
         versus_minimal("per-event", 1.5)),
    Goal("our APPEND statement ≤ 1.3x the minimal one (raw driver, 1 writer)", "issue 16", "throughput",
         versus_minimal("ceiling", 1.3)),
    Goal("durable 1-step at 64 concurrent: default settings ≥ 0.9x the best configuration", "issue 16",
         "throughput", default_is_best),
    Goal("growth: per-op cost at the largest journal ≤ 1.3x the smallest", "issue 16", "throughput", growth_flat),
    Goal("transient calls ≥ 100,000/s on one core, nothing written", "issue 3", "throughput", transient_rate),
    Goal("load of a long running execution (102 events) ≤ 1.3x a short one (4 events)", "issues 3, 15",
         "throughput", read_ratio),
    Goal("lazy leases within 5 % of heartbeat off, no-op shape", "issue 4", "lease-noop", lease_overhead("lazy", 5.0)),
    Goal("eager leases within 10 % of heartbeat off, no-op shape", "issue 4; Loom reference 25-30 %", "lease-noop",
         lease_overhead("eager", 10.0)),
    Goal("reaction latency p50 < 50 ms at 1,000 commits/s", "issue 6; Act reference ~125 ms", "reactions",
         reaction_latency),
    Goal("batch projection replay ≥ 19x one transaction per event", "issue 6; Act reference ~19x", "reactions",
         replay_gain),
    Goal("fast lane p50 ≤ 17 ms while a slow lane is busy (two lanes)", "issue 6; Act reference 130 → 17 ms",
         "reactions", fast_lane),
    Goal("HTTP fresh calls ≥ 650 QPS at 1 client, no errors", "issue 8; Lun reference (16 cores)", "http", http_rate),
    Goal("our aggregate do() faster than eventsourcing at every concurrency", "issue 15", "throughput",
         peer_ratio("eventsourcing")),
    Goal("our durable one-step flow faster than a DBOS one-step workflow at every concurrency", "issue 15",
         "throughput", peer_ratio("dbos")),
    Goal("gate: append overhead (ceiling/ours ≤ 1.5 at 1 writer)", "issue 15", "gate", gate_rule("append overhead")),
    Goal("gate: coalescing gain (≥ 3x per-event at 64 writers)", "issue 15", "gate", gate_rule("coalescing gain")),
    Goal("gate: eager lease cost (eager/off ≥ 0.80)", "issue 15", "gate", gate_rule("eager lease cost")),
    # Issue 33's table (its per-event/minimal, APPEND/minimal and coalesced/raw-coalescer rows are the issue-16
    # goals above, kept as they are: the same ratios with the same limits).
    Goal("durable 1-step at 64 concurrent, default settings ≥ 5,000 exec/s", "issue 33; Loom reference",
         "throughput", durable_default_rate),
    Goal("our durable one-step flow ≥ 20x a DBOS one-step workflow at every concurrency", "issue 33",
         "throughput", peer_ratio_at_least("dbos", 20.0)),
    Goal("SQLite: per-event append ≥ 0.5x the minimal sqlite3 statement (1 writer)", "issue 33", "throughput",
         sqlite_versus_minimal(0.5)),
    Goal("transient calls ≥ 1,000,000/s, nothing written", "issue 33", "throughput",
         lambda results: transient_rate(results, at_least=1_000_000.0)),
    Goal("gate: coalescer vs raw (coalesced-64/raw-coalescer ≥ 0.5 gated)", "issue 33", "gate",
         gate_rule("coalescer vs raw")),
    Goal("coalesced-64 ≥ 0.9x the raw coalescer (the gate's cell)", "issue 33", "gate",
         gate_rule("coalescer vs raw", goal_at_least=0.9)),
    Goal("eager lease overhead ≤ 15 % (eager/off ≥ 0.85, the gate's cell)", "issue 15", "gate",
         gate_rule("eager lease cost", goal_at_least=0.85)),
)
