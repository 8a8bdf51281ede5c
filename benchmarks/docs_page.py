"""docs/benchmarks.md from recorded runs: the plan of runs, one run per table, and the generated blocks.

`manage.py bench_docs` runs every entry of `PLAN` on the configured database (one bench command each,
recorded as usual), then rewrites, in docs/benchmarks.md, the blocks of that database between
markers, leaving every other line (the methodology, the other database's blocks) as it is:

    <!-- bench_docs:begin throughput/postgresql -->  ...generated...  <!-- bench_docs:end throughput/postgresql -->

Each block holds the exact command, the run's id, commit and database, its tables
(benchmarks/report.py) and what was skipped; the `goals/<vendor>` block holds every goal of
benchmarks/goals.py with its verdict computed from those runs. A block whose markers are not in the
file is added at the end. `--small` runs every entry at tiny sizes: a smoke run of the tool, never
figures of record.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from benchmarks.goals import GOALS
from benchmarks.models import BenchRun
from benchmarks.report import format_results
from benchmarks.sections import THROUGHPUT_SECTIONS

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
VENDOR_NAMES = {"postgresql": "PostgreSQL", "sqlite": "SQLite"}


@dataclass(frozen=True)
class Entry:
    """One run of one bench command: the tables of one block."""

    key: str
    title: str
    command: str
    argv: tuple[str, ...]
    small: tuple[str, ...]  # the same entry at smoke-test sizes


PLAN: tuple[Entry, ...] = (
    Entry("throughput", "bench_throughput, every section", "bench_throughput", (),
          # --small: every section but `shards`, whose second server's database aliases a test must declare
          # before its database guard is set up (tests/benchmarks/test_bench_smoke.py runs it on its own).
          (*(arg for name in THROUGHPUT_SECTIONS if name != "shards" for arg in ("--section", name)),
           "--concurrency", "1,2", "--ops", "16", "--append-repeats", "2", "--repeats", "2", "--coalesce-writers", "3",
           "--batch-writers", "2", "--notify-writers", "2", "--exec-concurrency", "2", "--exec-rounds", "1",
           "--effect-ms", "0", "--sweep-concurrency", "2", "--flow-concurrency", "1,2", "--flow-executions", "6",
           "--transient-calls", "50", "--transient-repeats", "2", "--read-concurrency", "2", "--read-ops", "5",
           "--lease-concurrency", "2", "--lease-repeats", "2", "--lease-execs", "4", "--peer-concurrency", "1,2",
           "--peer-ops", "3", "--peer-repeats", "2", "--growth-sizes", "2000,4000", "--growth-ops", "20")),
    Entry("append-interleaved", "append, interleaved repeats", "bench_throughput",
          ("--section", "append", "--append-repeats", "5", "--concurrency", "1,8,32"),
          ("--section", "append", "--append-repeats", "2", "--concurrency", "1,2", "--ops", "16")),
    Entry("lease", "bench_lease, both shapes", "bench_lease", ("--lease-concurrency", "16,64"),
          ("--lease-concurrency", "2", "--lease-repeats", "2", "--lease-execs", "4", "--lease-io-execs", "4",
           "--lease-io-ms", "1")),
    Entry("lease-noop", "bench_lease, the no-op shape with 9 repeats", "bench_lease",
          ("--lease-concurrency", "16,64", "--lease-shapes", "noop", "--lease-repeats", "9"),
          ("--lease-concurrency", "2", "--lease-shapes", "noop", "--lease-repeats", "2", "--lease-execs", "4")),
    Entry("aggregates", "bench_aggregates", "bench_aggregates", (),
          ("--iterations", "5", "--rounds", "2", "--fanout", "3", "--contenders", "3", "--reservations", "3",
           "--stock", "2")),
    Entry("reactions", "bench_reactions", "bench_reactions", (),
          ("--rates", "idle,40", "--seconds", "0.5", "--workers", "1,2", "--streams", "6", "--subscriptions", "40",
           "--replay", "100")),
    Entry("http", "bench_http", "bench_http", (),
          ("--requests", "8", "--concurrency", "1", "2", "--workers", "1", "--warmup", "2")),
    Entry("gate", "bench_gate, the ratio gate", "bench_gate", (),
          # Tiny sizes (few connections on a shared server): the rules' cells are then not at the gate's
          # sizes, so the gate's goals read "not measured" in a --small page.
          ("--gate-repeats", "2", "--ops", "16", "--coalesce-writers", "3", "--lease-concurrency", "2",
           "--lease-execs", "4")),
)


@dataclass
class Recorded:
    """What one entry's run left: the run (None if the command failed before recording) and its error."""

    entry: Entry
    argv: tuple[str, ...]
    run: BenchRun | None
    error: str = ""


def plan(only: Iterable[str] | None = None) -> list[Entry]:
    chosen = set(only or ())
    unknown = chosen - {e.key for e in PLAN}
    if unknown:
        raise CommandError(f"no plan entry {sorted(unknown)}; entries: {', '.join(e.key for e in PLAN)}")
    return [e for e in PLAN if not chosen or e.key in chosen]


def run_entry(entry: Entry, small: bool, log=lambda message: None) -> Recorded:
    """Run one entry's command in this process (recorded as every bench run is); a failed verification,
    gate or section is reported in the block (and the run is recorded as failed), not raised, so the
    other entries still run and their blocks are written."""
    argv = entry.small if small else entry.argv
    before = BenchRun.objects.filter(command=entry.command).order_by("-pk").values_list("pk", flat=True).first() or 0
    log(f"bench_docs: {command_line(entry.command, argv)}")
    error = ""
    try:
        call_command(entry.command, *argv, "--quiet", stdout=io.StringIO(), stderr=io.StringIO())
    except Exception as exc:  # a failed verification, gate or section: said in its block; the others still run
        error = f"{type(exc).__name__}: {exc}" if not isinstance(exc, CommandError) else str(exc)
    run = BenchRun.objects.filter(command=entry.command, pk__gt=before).order_by("-pk").first()
    return Recorded(entry, argv, run, error)


def database_env() -> str:
    """The DATABASE_URL a reader sets to repeat the run (no password: it is never written to the docs)."""
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        name = Path(s["NAME"]).resolve()
        # Inside the project: relative to it ($PWD, run from the project's folder); else the absolute path.
        where = f"$PWD/{name.relative_to(ROOT)}" if name.is_relative_to(ROOT) else str(name)
        return f"DATABASE_URL=sqlite:///{where}"
    return (f"DATABASE_URL=postgres://{s.get('USER') or 'postgres'}@{s.get('HOST') or '127.0.0.1'}:"
            f"{s.get('PORT') or 5432}/{s['NAME']}")


def command_line(command: str, argv: Sequence[str]) -> str:
    return " ".join(["python manage.py", command, *argv])


def render_entry(recorded: Recorded, vendor: str) -> str:
    entry, run = recorded.entry, recorded.run
    lines = [f"### {entry.title} ({VENDOR_NAMES.get(vendor, vendor)})", "",
             f"`{database_env()} {command_line(entry.command, recorded.argv)}`", ""]
    if run is None:
        lines.append(f"**Not recorded**: {recorded.error or 'the command recorded no run'}")
        return "\n".join(lines)
    lines.append(f"run #{run.pk}, {run.started_at:%Y-%m-%d %H:%M} UTC, commit {(run.git_commit or 'unknown')[:10]}"
                 f"{' (dirty)' if run.git_dirty else ''}, {run.db_version or run.db_vendor}, {run.cpu_count} CPUs, "
                 f"status {run.status}")
    if recorded.error:
        lines.append(f"\n**The command failed**: {recorded.error}")
    lines.append(format_results(run, run.results.all(), heading="####"))
    for section, reason in (run.settings.get("skipped") or {}).items():
        lines.append(f"- `{section}` skipped: {reason}")
    return "\n".join(lines).rstrip() + "\n"


def render_goals(recorded: dict[str, Recorded], vendor: str) -> str:
    lines = [f"### Goals on {VENDOR_NAMES.get(vendor, vendor)}, computed from the runs in the last column", "",
             "| goal | set by | measured | verdict | run |", "|---|---|---|---|---|"]
    for goal in GOALS:
        done = recorded.get(goal.entry)
        if done is None or done.run is None:
            lines.append(f"| {goal.name} | {goal.source} | entry `{goal.entry}` not run | not measured | - |")
            continue
        verdict = goal.evaluate(list(done.run.results.all()))
        lines.append(f"| {goal.name} | {goal.source} | {verdict.measured} | {verdict.verdict} | "
                     f"#{done.run.pk} ({goal.entry}) |")
    return "\n".join(lines) + "\n"


def previous_runs(text: str, vendor: str) -> dict[str, Recorded]:
    """The runs named in the page's existing blocks of `vendor` (`run #N, ...`), by entry: the goals of an
    entry not rerun this time (`--only`) are computed from the run its block already shows."""
    found = {}
    for entry in PLAN:
        block = re.search(rf"<!-- bench_docs:begin {re.escape(entry.key)}/{vendor} -->\n(.*?)<!-- bench_docs:end",
                          text, re.S)
        number = re.search(r"^run #(\d+), ", block[1], re.M) if block else None
        run = BenchRun.objects.filter(pk=int(number[1]), command=entry.command).first() if number else None
        if run is not None:
            found[entry.key] = Recorded(entry, entry.argv, run)
    return found


def blocks(recorded: dict[str, Recorded], vendor: str, previous: dict[str, Recorded] | None = None) -> dict[str, str]:
    """The generated blocks, by marker name `<key>/<vendor>`: the goals first (from this time's runs, else
    the runs the page already shows), then one per entry run this time."""
    out = {f"goals/{vendor}": render_goals({**(previous or {}), **recorded}, vendor)}
    for key, done in recorded.items():
        out[f"{key}/{vendor}"] = render_entry(done, vendor)
    return out


MARKER = re.compile(r"<!-- bench_docs:begin (?P<name>[\w./-]+) -->\n.*?<!-- bench_docs:end (?P=name) -->\n?", re.S)


def merge(text: str, generated: dict[str, str]) -> str:
    """`text` with each generated block put between its markers (added at the end when they are absent)."""
    done: set[str] = set()

    def replace(match: re.Match) -> str:
        name = match["name"]
        if name not in generated:
            return match[0]
        done.add(name)
        return wrap(name, generated[name])

    text = MARKER.sub(replace, text)
    missing = [name for name in generated if name not in done]
    if missing:
        text = text.rstrip("\n") + "\n\n" + "\n".join(wrap(name, generated[name]) for name in missing)
    return text


def wrap(name: str, body: str) -> str:
    return f"<!-- bench_docs:begin {name} -->\n{body.rstrip()}\n<!-- bench_docs:end {name} -->\n"
