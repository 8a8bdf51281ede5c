"""`manage.py loom_faults`: the fault suite (docs/reliability.md).

Every scenario runs real processes against the configured database, repeated with random kill
points, ends with SQL invariant checks and prints, per round, the counts of lost, duplicated and
stuck: all must be 0, else the command exits non-zero. Every round is recorded as a bench result
(command `loom_faults`, section `faults`), browsable with the other runs.
"""

from __future__ import annotations

import importlib
import json
import random
import shutil
import tempfile
import time
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from benchmarks import streams
from benchmarks.command import run_as_json
from benchmarks.faults import SCENARIOS
from benchmarks.faults.base import Round
from benchmarks.faults.checks import Verdict, remove
from benchmarks.faults.fixtures import create_tables
from benchmarks.recording import Recorder

FULL = {"repeats": 5, "processes": 8, "events": 240, "executions": 16, "steps": 5}
SMALL = {"repeats": 1, "processes": 4, "events": 40, "executions": 4, "steps": 3}


class Command(BaseCommand):
    help = "Run the fault scenarios with real processes; exits non-zero if anything was lost, doubled or stuck."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--scenario", action="append", choices=sorted(SCENARIOS),
                            help="Run only this scenario (repeatable). Default: all.")
        parser.add_argument("--small", action="store_true",
                            help="CI sizes: one round each, a few processes and events (see docs/reliability.md).")
        parser.add_argument("--repeats", type=int, help=f"Rounds per scenario (default {FULL['repeats']}).")
        parser.add_argument("--processes", type=int,
                            help=f"Processes of commit-storm and same-stream (default {FULL['processes']}).")
        parser.add_argument("--events", type=int, help=f"Events (appends, commits) per process (default "
                                                          f"{FULL['events']}).")
        parser.add_argument("--executions", type=int, help=f"Executions per kill (default {FULL['executions']}).")
        parser.add_argument("--steps", type=int, help=f"Steps per execution (default {FULL['steps']}).")
        parser.add_argument("--attempts", type=int, default=50, help="do_with_retry attempts in same-stream (50).")
        parser.add_argument("--bound", type=float, default=30.0,
                            help="Seconds a recovery or catch-up may take before what is not done counts as stuck.")
        parser.add_argument("--seed", type=int, help="Seed of the random kill points (default: random, printed).")
        parser.add_argument("--restart-cluster", default=None, metavar="VERSION/NAME",
                            help="pg-restart: the cluster the database is on, restarted with pg_ctlcluster "
                                 "(never a shared one). Without it, pg-restart is skipped.")
        parser.add_argument("--failovers", type=int, default=2,
                            help="Failovers per round of the failover scenario (default 2; docs/reliability.md).")
        parser.add_argument("--failover-rejoin", choices=("wait", "background"), default="wait",
                            help="After the last failover, wait for the lost node to be the standby again (default), "
                                 "or leave it rejoining in the background (tests/leases/test_failover.py).")
        parser.add_argument("--spike-port", type=int, default=None,
                            help="connection-spike: the port of a small PostgreSQL server of its own to fill "
                                 "(default SPIKE_PORT or 5505: scripts/spike-server). Without one it is skipped.")
        parser.add_argument("--workdir", default=None, help="Where the children's output goes (default: a "
                                                            "temporary folder, kept when a round fails).")
        parser.add_argument("--json", dest="json_path", help="Also write the run's figures to this JSON file.")
        parser.add_argument("--keep", action="store_true", help="Keep the rounds' streams and rows.")
        parser.add_argument("--quiet", action="store_true", help="Only the summary.")

    def handle(self, *args, **options) -> None:
        preset = SMALL if options["small"] else FULL
        for key, value in preset.items():
            if options.get(key) is None:
                options[key] = value
        seed = options["seed"] if options["seed"] is not None else random.randrange(2**32)
        options["seed"] = seed
        rng = random.Random(seed)
        chosen = options["scenario"] or list(SCENARIOS)
        workdir = Path(options["workdir"] or tempfile.mkdtemp(prefix="loom-faults-"))
        create_tables()
        totals: dict[str, dict[str, int]] = {}
        failed: list[str] = []
        with Recorder("loom_faults", options) as recorder:
            self.stdout.write(f"loom_faults on {connection.vendor}, seed {seed}, children's output in {workdir}")
            for name in chosen:
                module = importlib.import_module(SCENARIOS[name])
                reason = self._cannot_run(module, options)
                if reason:
                    recorder.skip(name, reason)
                    self.stdout.write(f"{name}: skipped: {reason}")
                    continue
                for i in range(options["repeats"]):
                    r = Round(name, i, streams.prefix(recorder.run.pk, name, i).replace("bench:", "faults:", 1),
                              workdir / f"{name}-{i}", options, random.Random(rng.random()), self._log(options))
                    verdict, error = self._round(module, r)
                    seconds = round(time.monotonic() - r.started, 2)
                    recorder.add("faults", name, {"round": i, **r.params}, count=verdict.details.get("events"),
                                 lost=verdict.lost, duplicated=verdict.duplicated, stuck=verdict.stuck,
                                 error=error, seconds=seconds, **{k: v for k, v in verdict.details.items() if v},
                                 **r.figures)
                    sums = totals.setdefault(name, {"rounds": 0, "lost": 0, "duplicated": 0, "stuck": 0, "errors": 0})
                    sums["rounds"] += 1
                    for key in ("lost", "duplicated", "stuck"):
                        sums[key] += getattr(verdict, key)
                    sums["errors"] += int(bool(error))
                    bad = error or not verdict.ok
                    if bad:
                        failed.append(f"{name} round {i + 1}")
                    self.stdout.write(
                        f"{name} round {i + 1}/{options['repeats']}: lost {verdict.lost}, duplicated "
                        f"{verdict.duplicated}, stuck {verdict.stuck}"
                        + (f" ({verdict.problems()})" if not verdict.ok else "")
                        + (f"; ERROR {error.splitlines()[0][:300]}" if error else "")
                        + f" [{', '.join(f'{k}={v}' for k, v in r.params.items())}] {seconds:.1f}s"
                        + "".join(f", {k} {v}" for k, v in r.figures.items()))
                    if not bad and not options["keep"]:
                        remove(r.prefix)
            self._summary(totals)
            if options.get("json_path"):
                Path(options["json_path"]).write_text(json.dumps(run_as_json(recorder.run, recorder.results),
                                                                 indent=2))
            self.stdout.write(f"recorded as run #{recorder.run.pk} (browse it at /bench/runs/{recorder.run.pk}/)")
            if failed:
                raise CommandError(f"faults found in {len(failed)} round(s): {', '.join(failed)} "
                                   f"(seed {seed}; output kept in {workdir})")
        if not options["workdir"]:
            shutil.rmtree(workdir, ignore_errors=True)  # nothing failed: nothing to look at

    def _cannot_run(self, module, options: dict) -> str | None:
        if module.POSTGRES_ONLY and connection.vendor != "postgresql":
            return ("needs PostgreSQL: several worker and drain processes on one database "
                    "(on SQLite run one worker process, docs/projections.md)")
        check = getattr(module, "cannot_run", None)
        return check(options) if check else None

    def _round(self, module, r: Round) -> tuple[Verdict, str]:
        """Run one round; an exception (a child that failed, a deadline) is an error of the round."""
        try:
            return module.run(r), ""
        except Exception as exc:
            return r.verdict, f"{type(exc).__name__}: {exc}"

    def _log(self, options: dict):
        def log(message: str) -> None:
            if not options["quiet"]:
                self.stderr.write(message)

        return log

    def _summary(self, totals: dict[str, dict[str, int]]) -> None:
        lines = ["", "| scenario | rounds | lost | duplicated | stuck | errors |", "|---|---|---|---|---|---|"]
        for name, s in totals.items():
            lines.append(f"| {name} | {s['rounds']} | {s['lost']} | {s['duplicated']} | {s['stuck']} | {s['errors']} |")
        self.stdout.write("\n".join(lines))
