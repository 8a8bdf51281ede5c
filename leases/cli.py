"""The leases app's part of `manage.py loom` (docs/cli.md): the `schedules` noun (list; run one now, pause,
resume or backfill it) and what the execution verbs learn from this app (an execution's lease, and the id
prefix of executions a schedule started: `executions list --schedule`, the schedule line of `show`).
`register()` adds them through journal/cli.py's seams, from LeasesConfig.ready(). The operating verbs are the
admin's actions (leases/schedule_ops.py): they say what they did and refuse (exit 1) what they cannot do."""

from __future__ import annotations

from django.db import router
from django.utils import timezone

from journal import cli
from journal.cli import USAGE, Refused, Reply, acting, iso, options, parse_since, table
from journal.timestamps import stamp
from leases import schedule_ops as ops
from leases.models import Lease, Schedule
from leases.schedules import ID_PREFIX


def schedule_arguments(parser) -> None:
    options(parser)
    parser.add_argument("action", nargs="?", default="list",
                        choices=["list", "run-now", "pause", "resume", "backfill"])
    parser.add_argument("name", nargs="?", metavar="SCHEDULE")
    parser.add_argument("--from", dest="start", help="backfill: the range's start (ISO time or age: 2h).")
    parser.add_argument("--to", dest="end", help="backfill: the range's end (ISO time or age: 0s).")


def schedule_dispatch(parsed: dict, using: str | None) -> Reply:
    if parsed["action"] == "list":
        return schedules(using)
    return schedule_action(using, parsed["action"], parsed["name"], parsed["start"], parsed["end"])


def schedules(using: str | None) -> Reply:
    """Every schedule: cron, its time zone, flow, catch-up policy, next and last tick (UTC instants; on one
    database with LOOM_SHARDS: the router's alias of leases.Schedule)."""
    rows = list(Schedule.objects.using(using or router.db_for_read(Schedule)).order_by("name"))
    data = [{"name": s.name, "cron": s.cron, "timezone": s.timezone, "flow": s.flow, "input": s.input,
             "catch_up": s.catch_up, "queue": s.queue or None, "enabled": s.enabled, "source": s.source,
             "next_tick_at": iso(s.next_tick_at), "last_tick_at": iso(s.last_tick_at),
             "last_execution_id": s.last_execution_id or None} for s in rows]
    lines = table(["schedule", "cron", "time zone", "flow", "catch-up", "next tick", "last tick", "enabled"],
                  [[s.name, s.cron, s.timezone, s.flow, s.catch_up, stamp(s.next_tick_at),
                    stamp(s.last_tick_at) or "-", "yes" if s.enabled else "no"] for s in rows])
    return Reply(data, lines or ["no schedules"])


def _need(value: str | None, what: str) -> str:
    if not value:
        raise Refused(f"name the {what}", USAGE)
    return value


@acting
def schedule_action(using: str | None, action: str, name: str | None, start: str | None = None,
                    end: str | None = None) -> Reply:
    name = _need(name, "schedule")
    if action == "run-now":
        eid = ops.run_now(name, "loom CLI", using)
        return Reply({"schedule": name, "execution_id": eid}, [f"schedule {name}: queued {eid}"])
    if action in ("pause", "resume"):
        changed = ops.pause(name, "loom CLI", using) if action == "pause" else ops.resume(name, using)
        said = {"pause": ("paused", "already paused"), "resume": ("resumed", "was not paused")}[action][not changed]
        return Reply({"schedule": name, "paused": action == "pause", "changed": changed},
                     [f"schedule {name}: {said}"])
    if not start or not end:
        raise Refused("backfill needs --from and --to (ISO times, UTC unless they say otherwise, or ages: 2h)", USAGE)
    done = ops.backfill(name, parse_since(start), parse_since(end), "loom CLI", using)
    return Reply({"schedule": name, "started": done.started, "already": done.already, "expired": done.expired},
                 [done.summary()] + [f"  {eid}" for eid in done.started])


def lease(using: str, execution_id: str) -> dict | None:
    """An execution's lease row for `executions show` (None: nobody holds it)."""
    row = Lease.objects.using(using).filter(execution_id=execution_id).first()
    if row is None:
        return None
    return {"owner": row.owner_id, "fence_token": row.fence_token, "expires_at": iso(row.expires_at),
            "expired": row.expires_at < timezone.now()}


def register() -> None:
    """Add the leases app's noun and parts to `manage.py loom` (LeasesConfig.ready())."""
    cli.add_cli_noun("schedules", schedule_arguments, schedule_dispatch, place=40,
                     help="Schedules: cron, flow, next and last tick; run one now, pause, resume or backfill it.")
    cli.add_cli_part(lease=lease, schedule_prefix=ID_PREFIX)
