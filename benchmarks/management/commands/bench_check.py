"""`manage.py bench_check`: absolute p50s of recorded runs against a baseline taken on the SAME machine.

For a user's own fixed hardware; CI does not run it (absolute figures on a shared runner move with
the neighbours' load): CI runs `bench_gate`, which gates ratios measured within one run.

    manage.py bench_throughput --section append --concurrency 1 --ops 500 --quiet   # x3 for --best-of 3
    manage.py bench_check --baseline benchmarks/perf-baseline.json --best-of 3

Exit 0 when every gated cell's p50 is within the factor (1.5x) of its baseline, 1 when one is
slower or was not measured, 2 on a usage problem (no baseline, no run). `--update` writes the
baseline file from the current run(s). Which cells are gated, and why: benchmarks/compare.py `GATED`.
"""

from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from django.utils import timezone

from benchmarks.compare import (
    CONTROLS,
    DEFAULT_FACTOR,
    GATED,
    Baseline,
    BaselineError,
    Cell,
    best_p50,
    gate,
    is_gated,
    read_baseline,
    write_baseline,
)
from benchmarks.models import BenchRun

DEFAULT_BASELINE = Path(__file__).resolve().parents[2] / "perf-baseline.json"
SCAN_LIMIT = 200  # recent runs looked at when finding the ones that measured the gated cells


class Command(BaseCommand):
    help = "Fail (exit 1) when a gated benchmark cell's p50 is more than 1.5x its baseline; --update writes it."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--baseline", default=str(DEFAULT_BASELINE),
                            help="A baseline JSON file, or the id of a recorded run. Default: %(default)s")
        parser.add_argument("--run", type=int, help="Check this run (default: the latest runs on this database "
                                                     "that measured the gated cells).")
        parser.add_argument("--best-of", type=int, default=1, help="Take each cell's lowest p50 over the latest "
                                                                    "N runs (repeat the bench N times in CI).")
        parser.add_argument("--factor", type=float, help=f"Allowed p50 growth (default: the file's, else "
                                                          f"{DEFAULT_FACTOR}).")
        parser.add_argument("--update", action="store_true", help="Write the baseline file from the current run(s).")

    def handle(self, *args, **options) -> None:
        if options["best_of"] < 1:
            raise CommandError("--best-of must be at least 1", returncode=2)
        runs = self._current_runs(options)
        vendor = runs[0].db_vendor
        current = best_p50([Cell.from_result(r) for r in run.results.all()] for run in runs)
        ids = ", ".join(f"#{run.pk}" for run in runs)
        if options["update"]:
            self._update(Path(options["baseline"]), vendor, runs[0], current, options["factor"], ids)
            return

        baseline = self._baseline(options["baseline"], vendor)
        factor = options["factor"] or baseline.factor
        outcomes = gate(baseline.cells, current, factor)
        self.stdout.write(f"bench_check: {vendor}, run{'s' if len(runs) > 1 else ''} {ids} against "
                          f"{options['baseline']} (p50 may grow up to {factor:g}x)")
        for outcome in outcomes:
            if outcome.current_p50_ms is None:
                line = f"  FAIL {outcome.key}: not measured (baseline p50 {outcome.baseline_p50_ms:.4f} ms)"
            else:
                verdict = "FAIL" if outcome.failed else "ok  "
                line = (f"  {verdict} {outcome.key}: p50 {outcome.current_p50_ms:.4f} ms vs baseline "
                        f"{outcome.baseline_p50_ms:.4f} ms ({outcome.ratio:.2f}x)")
            self.stdout.write(line)
        failed = [o for o in outcomes if o.failed]
        if not failed:
            self.stdout.write(f"bench_check: {len(outcomes)} gated cell(s) within {factor:g}x of the baseline")
            return
        for cell in current.values():
            if is_gated(cell, CONTROLS):
                self.stdout.write(f"  note: control {cell.key} (raw statement) p50 {cell.p50_ms:.4f} ms; if it "
                                  "slowed as much, the machine is slower, not the code")
        raise CommandError(f"{len(failed)} of {len(outcomes)} gated cell(s) regressed or were not measured: "
                           + ", ".join(o.key for o in failed), returncode=1)

    def _current_runs(self, options) -> list[BenchRun]:
        if options["run"] is not None:
            try:
                return [BenchRun.objects.get(pk=options["run"])]
            except BenchRun.DoesNotExist:
                raise CommandError(f"no recorded run #{options['run']}", returncode=2) from None
        vendor = connection.vendor
        found = []
        recent = (BenchRun.objects.filter(status=BenchRun.Status.OK, db_vendor=vendor)
                  .prefetch_related("results").order_by("-started_at", "-id")[:SCAN_LIMIT])
        for run in recent:
            if any(is_gated(Cell.from_result(r)) for r in run.results.all()):
                found.append(run)
                if len(found) == options["best_of"]:
                    break
        if not found:
            raise CommandError(f"no successful run on {vendor} measured a gated cell; run e.g. "
                               "`manage.py bench_throughput --section append --concurrency 1` first", returncode=2)
        return found

    def _baseline(self, spec: str, vendor: str) -> Baseline:
        if spec.isdigit():
            try:
                run = BenchRun.objects.get(pk=int(spec))
            except BenchRun.DoesNotExist:
                raise CommandError(f"no recorded run #{spec} to use as baseline", returncode=2) from None
            cells = {c.key: c.p50_ms for c in map(Cell.from_result, run.results.all())
                     if is_gated(c) and c.p50_ms is not None}
            if not cells:
                raise CommandError(f"baseline run #{spec} measured no gated cell", returncode=2)
            return Baseline(run.db_vendor, cells, run.pk, run.git_commit, run.machine)
        try:
            return read_baseline(Path(spec), vendor)
        except BaselineError as exc:
            raise CommandError(str(exc), returncode=2) from None

    def _update(self, path: Path, vendor: str, run: BenchRun, current: dict[str, Cell], factor: float | None,
                ids: str) -> None:
        if str(path).isdigit():
            raise CommandError("--update writes a baseline file; give --baseline a path", returncode=2)
        cells = {key: cell.p50_ms for key, cell in current.items() if is_gated(cell, GATED)}
        if not cells:
            raise CommandError(f"run(s) {ids} measured no gated cell; nothing to write", returncode=2)
        write_baseline(path, Baseline(vendor, cells, run.pk, run.git_commit, run.machine,
                                      timezone.now().isoformat(timespec="seconds"), factor or DEFAULT_FACTOR))
        self.stdout.write(f"bench_check: wrote {len(cells)} gated cell(s) for {vendor} from run(s) {ids} to {path}")
        for key in sorted(cells):
            self.stdout.write(f"  {key}: p50 {cells[key]:.4f} ms")
