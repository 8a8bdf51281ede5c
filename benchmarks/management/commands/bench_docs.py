"""`manage.py bench_docs`: run the agreed bench commands, then write docs/benchmarks.md from their recorded runs.

One run per table, each block with its exact command, run id, commit and database, and the goals with
their verdicts computed from the figures (benchmarks/docs_page.py, benchmarks/goals.py). Run it once per
database (the blocks of the other database are kept):

    python manage.py bench_docs                                   # SQLite (the default database)
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/loom_docs python manage.py bench_docs

`--small` runs every entry at tiny sizes: it proves the tool and the page, it records no figures of record.
"""

from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand
from django.db import connection

from benchmarks.docs_page import DOC, PLAN, blocks, merge, plan, previous_runs, run_entry


class Command(BaseCommand):
    help = "Run the bench commands of the docs plan on this database and write docs/benchmarks.md from the runs."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--small", action="store_true", help="Tiny sizes: a smoke run of the tool, not figures.")
        parser.add_argument("--only", action="append", choices=[e.key for e in PLAN],
                            help="Run only this plan entry (repeatable); the other blocks stay as they are.")
        parser.add_argument("--output", default=str(DOC), help="The page to write (default %(default)s).")

    def handle(self, *args, small: bool = False, only=None, output: str = str(DOC), **options) -> None:
        vendor = connection.vendor
        log = self.stderr.write if options.get("verbosity", 1) > 0 else (lambda message: None)
        recorded = {entry.key: run_entry(entry, small, log) for entry in plan(only)}
        path = Path(output)
        text = path.read_text() if path.exists() else "# Benchmarks\n"
        path.write_text(merge(text, blocks(recorded, vendor, previous_runs(text, vendor))))
        for done in recorded.values():
            state = f"run #{done.run.pk} ({done.run.status})" if done.run else "not recorded"
            self.stdout.write(f"{done.entry.key}: {state}{': ' + done.error if done.error else ''}")
        note = " (--small: not figures of record)" if small else ""
        self.stdout.write(f"bench_docs: wrote the {vendor} blocks of {path}{note}")
