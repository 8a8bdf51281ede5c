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

`--json` on every verb prints one JSON document on stdout (an error too: {"ok": false, ...}). Exit
codes: 0 done, 1 refused or not found, 2 usage, 3 not available here (docs/cli.md). The verbs live
in journal/cli.py; this module only parses.
"""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from journal import cli

ACTIONS = ("show", "steps", "cancel", "resume", "retry", "fork", "export")


class Command(BaseCommand):
    help = "Inspect and operate executions, queues and schedules (docs/cli.md). Exit codes: 0 ok, 1 refused " \
           "or not found, 2 usage, 3 not available."

    def add_arguments(self, parser) -> None:
        common = {"json": ("--json", {"action": "store_true", "help": "Print one JSON document."}),
                  "database": ("--database", {"default": None, "help": "The database alias (default: the default "
                                          "database; with LOOM_SHARDS an execution's shard, every shard "
                                          "for lists)."})}

        def options(sub):
            for flag, kwargs in common.values():
                sub.add_argument(flag, **kwargs)
            return sub

        nouns = parser.add_subparsers(dest="noun", required=True,
                                      metavar="{executions,queues,workers,schedules,flows,replay,retention,archive}")
        executions = nouns.add_parser("executions", help="List, show and operate executions.")
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
        queue_cmd = options(nouns.add_parser("queues", help="Queues: running, cap, depth; pause or resume one."))
        queue_cmd.add_argument("action", nargs="?", default="list", choices=["list", "pause", "resume"])
        queue_cmd.add_argument("name", nargs="?", metavar="QUEUE")
        worker_cmd = options(nouns.add_parser("workers", help="Running workers and their load; drain one."))
        worker_cmd.add_argument("action", nargs="?", default="list", choices=["list", "drain"])
        worker_cmd.add_argument("name", nargs="?", metavar="WORKER_ID")
        schedule_cmd = options(nouns.add_parser("schedules", help="Schedules: cron, flow, next and last tick; run "
                                                "one now, pause, resume or backfill it."))
        schedule_cmd.add_argument("action", nargs="?", default="list",
                                  choices=["list", "run-now", "pause", "resume", "backfill"])
        schedule_cmd.add_argument("name", nargs="?", metavar="SCHEDULE")
        schedule_cmd.add_argument("--from", dest="start", help="backfill: the range's start (ISO time or age: 2h).")
        schedule_cmd.add_argument("--to", dest="end", help="backfill: the range's end (ISO time or age: 0s).")
        keeping = nouns.add_parser("retention", help="Retention: what is due, what was removed; run a round.")
        kept = keeping.add_subparsers(dest="verb", required=True, metavar="{status,run}")
        options(kept.add_parser("status", help="Due per policy and the newest removal batches."))
        running = options(kept.add_parser("run", help="Remove what is due now (batches until none is due)."))
        running.add_argument("--max-batches", type=int, default=None, dest="max_batches")
        archiving = nouns.add_parser("archive", help="Archives written before removal: list, show, restore.")
        arch = archiving.add_subparsers(dest="verb", required=True, metavar="{list,show,restore}")
        options(arch.add_parser("list", help="Every archive object."))
        for verb, text in (("show", "The manifest and the executions of one archive."),
                           ("restore", "Put its executions back as they were (refused whole if one exists).")):
            sub = options(arch.add_parser(verb, help=text))
            sub.add_argument("name", metavar="NAME")
            if verb == "restore":
                sub.add_argument("--id", action="append", dest="ids", help="Only this execution (repeatable).")
        versions = options(nouns.add_parser("flows", help="Flow versions: registered here, live executions of each."))
        versions.add_argument("--flow", help="Only this flow.")
        replaying = options(nouns.add_parser("replay", help="Replay recorded histories against this code, writing "
                                             "nothing; exit 1 names the first that would not resume."))
        replaying.add_argument("execution_ids", nargs="*", metavar="ID", help="These executions (default: the "
                               "newest --last of each flow).")
        replaying.add_argument("--flow", action="append", dest="flows", help="Only this flow (repeatable).")
        replaying.add_argument("--last", type=int, default=20, help="The newest N of each flow (default 20).")
        replaying.add_argument("--settled", action="store_true", help="Completed and cancelled executions too "
                               "(nothing replays them again; then the code must reproduce their whole log).")
        replaying.add_argument("--file", action="append", dest="files", metavar="PATH",
                               help="A history `loom executions export` wrote (repeatable).")

    def handle(self, *args, **options) -> None:
        as_json, using = options["json"], options["database"]
        try:
            reply = self.dispatch(options, cli.check_alias(using))
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

    def dispatch(self, options: dict, using: str | None) -> cli.Reply:
        noun = options["noun"]
        if noun == "retention":
            return cli.retention(using, options["verb"], options.get("max_batches"))
        if noun == "archive":
            return cli.archive(using, options["verb"], options.get("name"), options.get("ids"))
        if noun in ("queues", "workers", "schedules") and options["action"] != "list":
            from queues import operations_cli as ops  # pause/resume, drain, run-now/pause/resume/backfill

            if noun == "queues":
                return ops.queue_action(using, options["action"], options["name"])
            if noun == "workers":
                return ops.drain(using, options["name"])
            return ops.schedule_action(using, options["action"], options["name"], options["start"], options["end"])
        if noun == "queues":
            return cli.queues(using)
        if noun == "workers":
            from queues import operations_cli as ops

            return ops.workers(using)
        if noun == "schedules":
            return cli.schedules(using)
        if noun == "flows":
            return cli.flows(using, options["flow"])
        if noun == "replay":
            return cli.replay(using, options["execution_ids"], files=options["files"], flows=options["flows"],
                              last=options["last"], settled=options["settled"])
        verb, eid = options["verb"], options.get("execution_id")
        if verb == "list":
            return cli.list_executions(using, status=options["status"], flow=options["flow"], queue=options["queue"],
                                       schedule=options["schedule"], since=options["since"], stuck=options["stuck"],
                                       limit=options["limit"], search=options["search"], until=options["until"])
        if verb == "cancel":
            return cli.cancel(using, eid, options["reason"])
        if verb == "resume":
            return cli.resume(using, eid, options["force"])
        if verb == "fork":
            return cli.fork(using, eid, options["from_step"], options["new_id"])
        if verb in ("show", "steps"):
            return getattr(cli, verb)(using, eid, options["reveal"])
        return getattr(cli, verb)(using, eid)

