"""`manage.py bench_report RUN_ID`: a recorded run's tables in Markdown (the docs are pasted from it)."""

from django.core.management.base import BaseCommand, CommandError

from benchmarks.models import BenchRun
from benchmarks.report import format_results


class Command(BaseCommand):
    help = "Print a recorded benchmark run as Markdown tables (default: the latest run)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("run_id", nargs="?", type=int, help="BenchRun id (default: the latest).")

    def handle(self, *args, run_id: int | None = None, **options) -> None:
        runs = BenchRun.objects.all()
        run = runs.filter(pk=run_id).first() if run_id else runs.first()
        if run is None:
            raise CommandError(f"no recorded run {run_id}" if run_id else "no recorded runs yet")
        self.stdout.write(f"`{run.argv}` — {run.started_at:%Y-%m-%d %H:%M} UTC, status {run.status}")
        self.stdout.write(format_results(run, run.results.all()))
        skipped = run.settings.get("skipped") or {}
        for section, reason in skipped.items():
            self.stdout.write(f"- `{section}` skipped: {reason}")
