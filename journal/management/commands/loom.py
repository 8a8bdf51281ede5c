"""`manage.py loom`: inspect and operate executions, queues and schedules from a terminal.

    manage.py loom executions list [--status S] [--flow F] [--queue Q] [--schedule NAME] [--since 2h] [--until 1h]
        [--search TEXT] [--stuck]
    manage.py loom executions show|steps ID [--reveal]
    manage.py loom executions cancel|resume|retry ID
    manage.py loom executions fork ID --from-step N
    manage.py loom executions export ID            # its recorded history, JSON (what replay --file reads)
    manage.py loom queues
    manage.py loom schedules
    manage.py loom flows [--flow F]                # versions: registered here, live executions of each
    manage.py loom replay [ID ...] [--flow F] [--last N] [--settled] [--file PATH]  # exit 1: would not resume
    manage.py loom aggregates resnapshot [--state S] [--stream ID] [--all] [--dry-run] [--batch N]

`--json` on every verb prints one JSON document on stdout (an error too: {"ok": false, ...}). Exit
codes: 0 done, 1 refused or not found, 2 usage, 3 not available here, 4 the database (a shard) could not be
reached (docs/cli.md). The verbs live
in journal/cli.py; this module only parses. Its nouns are those registered with journal.cli.add_cli_noun: the
journal's below, and those the apps above add from their ready() (queues/cli.py: queues, workers; leases/cli.py:
schedules), so the journal names none of them.
"""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError
from django.db import InterfaceError, OperationalError

from journal import cli
from journal.cli import options
from journal.reach import cannot_reach


def _execution_arguments(executions) -> None:
    verbs = executions.add_subparsers(dest="verb", required=True,
                                      metavar="{list,show,steps,cancel,resume,retry,fork,export}")
    listing = options(verbs.add_parser("list", help="The newest executions matching the filters."))
    listing.add_argument("--status", help="running, completed, failed, cancelled, stuck, suspended")
    listing.add_argument("--flow", help="Only this flow.")
    listing.add_argument("--queue", help="Only executions enqueued on this queue.")
    listing.add_argument("--schedule", help="Only executions started by this schedule.")
    listing.add_argument("--since", help="Created since: an age (30s, 15m, 2h, 7d) or an ISO time.")
    listing.add_argument("--until", help="Created before: an age (30s, 15m, 2h, 7d) or an ISO time.")
    listing.add_argument("--search", help="Id, flow, a value of the input or a part of the error text.")
    listing.add_argument("--stuck", action="store_true",
                         help="Stuck (recovery gave up) or running with an expired lease.")
    listing.add_argument("--limit", type=int, default=50, help="At most this many (default 50).")
    for verb, text in (("show", "Header, lease, fence, queue and timeline."), ("steps", "The timeline."),
                       ("cancel", "Cancel (recorded as EXECUTION_CANCELLED)."),
                       ("resume", "Hand the execution to a worker, which continues it from its log."),
                       ("retry", "A new attempt of a failed execution, handed to a worker."),
                       ("fork", "A new execution replaying the first N steps (needs flows that wait)."),
                       ("export", "Its recorded history as JSON (what `loom replay --file` reads).")):
        sub = options(verbs.add_parser(verb, help=text))
        sub.add_argument("execution_id", metavar="ID")
        if verb in ("show", "steps"):
            sub.add_argument("--reveal", action="store_true",
                             help="Print sensitive fields (docs/privacy.md) in clear; redacted without it.")
        if verb == "cancel":
            sub.add_argument("--reason", default="", help="Recorded with the cancel.")
        if verb == "resume":
            sub.add_argument("--force", action="store_true",
                             help="Take it over even from a live owner (its in-flight step may run twice).")
        if verb == "fork":
            sub.add_argument("--from-step", type=int, required=True, dest="from_step")
            sub.add_argument("--new-id", dest="new_id", help="The new execution's id (default: minted).")


def _executions(parsed: dict, using: str | None) -> cli.Reply:
    verb, eid = parsed["verb"], parsed.get("execution_id")
    if verb == "list":
        return cli.list_executions(using, status=parsed["status"], flow=parsed["flow"], queue=parsed["queue"],
                                   schedule=parsed["schedule"], since=parsed["since"], stuck=parsed["stuck"],
                                   limit=parsed["limit"], search=parsed["search"], until=parsed["until"])
    if verb == "cancel":
        return cli.cancel(using, eid, parsed["reason"])
    if verb == "resume":
        return cli.resume(using, eid, parsed["force"])
    if verb == "fork":
        return cli.fork(using, eid, parsed["from_step"], parsed["new_id"])
    if verb in ("show", "steps"):
        return getattr(cli, verb)(using, eid, parsed["reveal"])
    return getattr(cli, verb)(using, eid)


def _retention_arguments(keeping) -> None:
    kept = keeping.add_subparsers(dest="verb", required=True, metavar="{status,run,compact}")
    options(kept.add_parser("status", help="Due per policy and the newest removal and compaction batches."))
    running = options(kept.add_parser("run", help="Remove what is due now (batches until none is due)."))
    running.add_argument("--max-batches", type=int, default=None, dest="max_batches")
    compacting = options(kept.add_parser("compact", help="Compact the compacted states' aggregate streams now (the "
                                                         "events before each newest snapshot)."))
    compacting.add_argument("--max-batches", type=int, default=None, dest="max_batches")


def _aggregates_arguments(aggregating) -> None:
    verbs = aggregating.add_subparsers(dest="verb", required=True, metavar="{resnapshot}")
    redo = options(verbs.add_parser("resnapshot", help="Fresh snapshots from this code for the streams whose newest "
                                                      "snapshot no longer fits (--all: every snapshotted stream)."))
    redo.add_argument("--state", help="Only this state's streams.")
    redo.add_argument("--stream", help="Only this stream (its id: the state's prefix and the aggregate id).")
    redo.add_argument("--all", action="store_true", dest="everything",
                      help="Every stream with a snapshot, even one that fits (a fold changed, the schema did not).")
    redo.add_argument("--dry-run", action="store_true", dest="dry_run", help="Fold and report; write nothing.")
    redo.add_argument("--batch", type=int, default=100, help="Streams per page, one progress line each (100).")


def _aggregates(parsed: dict, using: str | None) -> cli.Reply:
    return cli.resnapshot(using, state=parsed["state"], stream=parsed["stream"], everything=parsed["everything"],
                          dry_run=parsed["dry_run"], batch=parsed["batch"], progress=parsed.get("progress"))


def _archive_arguments(archiving) -> None:
    arch = archiving.add_subparsers(dest="verb", required=True, metavar="{list,show,restore}")
    options(arch.add_parser("list", help="Every archive object."))
    for verb, text in (("show", "The manifest and the executions of one archive."),
                       ("restore", "Put its executions back as they were (refused whole if one exists).")):
        sub = options(arch.add_parser(verb, help=text))
        sub.add_argument("name", metavar="NAME")
        if verb == "restore":
            sub.add_argument("--id", action="append", dest="ids", help="Only this execution (repeatable).")


def _flows_arguments(versions) -> None:
    options(versions)
    versions.add_argument("--flow", help="Only this flow.")


def _replay_arguments(replaying) -> None:
    options(replaying)
    replaying.add_argument("execution_ids", nargs="*", metavar="ID", help="These executions (default: the "
                           "newest --last of each flow).")
    replaying.add_argument("--flow", action="append", dest="flows", help="Only this flow (repeatable).")
    replaying.add_argument("--last", type=int, default=20, help="The newest N of each flow (default 20).")
    replaying.add_argument("--settled", action="store_true", help="Completed and cancelled executions too "
                           "(nothing replays them again; then the code must reproduce their whole log).")
    replaying.add_argument("--file", action="append", dest="files", metavar="PATH",
                           help="A history `loom executions export` wrote (repeatable).")


# The journal's nouns; the apps' take the places between (queues 20, workers 30, schedules 40).
cli.add_cli_noun("executions", _execution_arguments, _executions, place=10,
                 help="List, show and operate executions.")
cli.add_cli_noun("retention", _retention_arguments, place=50,
                 dispatch=lambda parsed, using: cli.retention(using, parsed["verb"], parsed.get("max_batches")),
                 help="Retention: what is due, what was removed; run a round; compact aggregate streams.")
cli.add_cli_noun("aggregates", _aggregates_arguments, _aggregates, place=55,
                 help="Aggregates: re-snapshot streams whose snapshot an older code took.")
cli.add_cli_noun("archive", _archive_arguments, place=60,
                 dispatch=lambda parsed, using: cli.archive(using, parsed["verb"], parsed.get("name"),
                                                            parsed.get("ids")),
                 help="Archives written before removal: list, show, restore.")
cli.add_cli_noun("flows", _flows_arguments, lambda parsed, using: cli.flows(using, parsed["flow"]), place=70,
                 help="Flow versions: registered here, live executions of each.")
cli.add_cli_noun("replay", _replay_arguments, place=80,
                 dispatch=lambda parsed, using: cli.replay(using, parsed["execution_ids"], files=parsed["files"],
                                                           flows=parsed["flows"], last=parsed["last"],
                                                           settled=parsed["settled"]),
                 help="Replay recorded histories against this code, writing nothing; exit 1 names the first "
                      "that would not resume.")


class Command(BaseCommand):
    help = "Inspect and operate executions, queues and schedules (docs/cli.md). Exit codes: 0 ok, 1 refused " \
           "or not found, 2 usage, 3 not available, 4 database unreachable."

    def add_arguments(self, parser) -> None:
        registered = cli.nouns()
        nouns = parser.add_subparsers(dest="noun", required=True,
                                      metavar="{" + ",".join(noun.name for noun in registered) + "}")
        for noun in registered:
            noun.add_arguments(nouns.add_parser(noun.name, help=noun.help))

    def handle(self, *args, **options) -> None:
        as_json, using = options["json"], options["database"]
        try:
            try:
                options["progress"] = self.stderr.write  # a long verb's progress (stdout stays its reply)
                reply = cli.NOUNS[options["noun"]].dispatch(options, cli.check_alias(using))
            except (OperationalError, InterfaceError) as exc:  # a server down: exit 4 naming it, not a traceback
                if not cannot_reach(exc):
                    raise
                raise cli.unreachable(exc) from None
        except cli.Refused as refused:
            if as_json:
                found = {} if refused.data is None else {"results": refused.data}
                self.stdout.write(json.dumps({"ok": False, "error": str(refused), "type": refused.kind or None,
                                              "exit": refused.code, **found}, ensure_ascii=False, default=str))
            elif refused.lines:
                self.stdout.write("\n".join(refused.lines))
            raise CommandError(str(refused), returncode=refused.code) from None
        if as_json:
            self.stdout.write(json.dumps(reply.data, indent=2, ensure_ascii=False, default=str))
        else:
            self.stdout.write("\n".join(reply.lines))
