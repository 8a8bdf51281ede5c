"""The shape every bench command shares: sections, recording, a table, --json, progress output.

A section is a module with `run(ctx: SectionContext) -> None` (and optionally
`add_arguments(parser)`); a command lists its sections by name in `sections`.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterable
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from tqdm import tqdm

from benchmarks.recording import Recorder, VerificationError
from benchmarks.report import format_results


class SectionContext:
    """What a section gets: its options, the recorder, progress bars and a way to skip."""

    def __init__(self, command: BenchCommand, recorder: Recorder, section: str, options: dict):
        self.command = command
        self.recorder = recorder
        self.section = section
        self.options = options
        self.vendor = connection.vendor

    @property
    def run_id(self) -> int:
        return self.recorder.run.pk

    def record(self, scenario: str, params: dict | None = None, **figures):
        return self.recorder.add(self.section, scenario, params, **figures)

    def progress(self, total: int, desc: str) -> tqdm:
        return tqdm(total=total, desc=f"{self.section}: {desc}", unit="op", leave=False,
                    disable=self.options.get("quiet", False), file=self.command.stderr._out, dynamic_ncols=True)

    def log(self, message: str) -> None:
        if not self.options.get("quiet", False):
            self.command.stderr.write(message)

    def skip(self, reason: str) -> None:
        self.recorder.skip(self.section, reason)
        self.command.stdout.write(f"{self.section}: skipped: {reason}")

    def verify(self, what: str, expected: int, actual: int) -> None:
        """Fail loudly when what the workers report differs from the rows in the database."""
        if expected != actual:
            raise VerificationError(f"{self.section}: {what}: workers reported {expected}, database has {actual}")


class BenchCommand(BaseCommand):
    sections: dict[str, str] = {}  # section name -> module path
    default_sections: Iterable[str] | None = None

    def add_arguments(self, parser) -> None:
        parser.add_argument("--section", action="append", choices=sorted(self.sections),
                            help="Run only this section (repeatable). Default: all.")
        parser.add_argument("--json", dest="json_path", help="Also write the run's figures to this JSON file.")
        parser.add_argument("--quiet", action="store_true", help="No progress output.")
        parser.add_argument("--keep", action="store_true", help="Keep the benchmark's streams in the database.")
        for module in self._modules().values():
            if hasattr(module, "add_arguments"):
                module.add_arguments(parser)

    def _modules(self) -> dict:
        return {name: importlib.import_module(path) for name, path in self.sections.items()}

    def handle(self, *args, **options) -> None:
        chosen = options["section"] or list(self.default_sections or self.sections)
        modules = self._modules()
        failure: Exception | None = None
        with Recorder(self.__module__.rsplit(".", 1)[-1], options) as recorder:
            for name in chosen:
                ctx = SectionContext(self, recorder, name, options)
                try:
                    modules[name].run(ctx)
                except VerificationError as exc:
                    failure = exc
                    break
            if failure is not None:
                self._report(recorder, options)
                raise CommandError(str(failure))
            self.finish(recorder, options)
        self._report(recorder, options)
        self.conclude(recorder, options)

    def finish(self, recorder: Recorder, options: dict) -> None:
        """After every section ran, inside the recorded run: a command may record derived cells here."""

    def conclude(self, recorder: Recorder, options: dict) -> None:
        """After the run is recorded and reported: a command may fail here (a gate's exit status)."""

    def _report(self, recorder: Recorder, options: dict) -> None:
        run = recorder.run
        self.stdout.write(format_results(run, recorder.results))
        if options.get("json_path"):
            Path(options["json_path"]).write_text(json.dumps(run_as_json(run, recorder.results), indent=2))
            self.stdout.write(f"figures written to {options['json_path']}")
        self.stdout.write(f"recorded as run #{run.pk}: {run_link(run.pk)}, or in the admin under Benchmarks.")


def run_as_json(run, results) -> dict:
    fields = ("command", "argv", "git_commit", "git_dirty", "source_hash", "db_vendor", "db_version",
              "python_version", "django_version", "cpu_count", "machine", "status")
    return {
        "run": {"id": run.pk, "started_at": run.started_at.isoformat(), **{f: getattr(run, f) for f in fields},
                "settings": run.settings},
        "results": [
            {"section": r.section, "scenario": r.scenario, "params": r.params, "throughput": r.throughput,
             "unit": r.unit, "p50_ms": r.p50_ms, "p95_ms": r.p95_ms, "p99_ms": r.p99_ms, "max_ms": r.max_ms,
             "count": r.count, "metrics": r.metrics}
            for r in results
        ],
    }


def run_link(pk: int) -> str:
    """Where the run's page is, as true in any project as this process knows: the path benchmarks.urls has in
    this URLconf, after LOOM_RESULTS_URL when set (no host is guessed: a project serves it where it does)."""
    from django.urls import NoReverseMatch, reverse

    from benchmarks import conf

    try:
        path = reverse("benchmarks:run_detail", args=[pk])
    except NoReverseMatch:
        return "its page needs benchmarks.urls in your URLconf (docs/results.md)"
    base = (conf.get("LOOM_RESULTS_URL") or "").rstrip("/")
    return f"browse it at {base}{path}" if base else f"browse it at {path} on your site (LOOM_RESULTS_URL: a full link)"
