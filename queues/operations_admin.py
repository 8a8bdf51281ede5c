"""The operations page of the admin (Queues → Operations, /admin/queues/queue/operations/): the figures of
queues/operations.py as tables and server-rendered SVG charts (no script, no CDN), and the operator's actions,
each a POST button guarded by its own permission (view-only staff see the figures, no button):

- pause / resume a queue (queues.pause_queue; queues/pause.py);
- drain a worker (leases.drain_worker; leases/drain.py);
- a schedule's run now, pause, resume, backfill a range (leases.operate_schedule; leases/schedule_ops.py).

A refused action (unknown name, bad range) says why and changes nothing; every outcome is said as it happened.
A shard that cannot be read is left out of the figures and named at the top (queues/operations.py).
"""

from __future__ import annotations

from datetime import UTC, datetime
from html import escape

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from journal.reach import cannot_reach
from journal.timestamps import stamp
from leases import drain
from leases import schedule_ops as ops
from leases.models import Schedule
from leases.schedules import InvalidSchedule
from queues import operations, pause
from queues.exceptions import QueueError

PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#000000")
W, H, LEFT, RIGHT, TOP, BOTTOM = 560, 220, 56, 16, 34, 34


def _nice(value: float) -> float:
    for step in (1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 5000, 10000, 100000, 1e6, 1e9):
        if value <= step:
            return float(step)
    return float(value)


def svg_chart(title: str, series: list[operations.Series], y_label: str, edges: list[datetime],
              fixed_max: float | None = None) -> str:
    """Lines over the window's bucket ends `edges` (x, labelled HH:MM UTC), y from 0; a bucket a series has no
    value for (no execution finished: no failure rate) breaks its line. A legend across the top. Escaped markup."""
    values = [v for s in series for _, v in s.points]
    top = fixed_max or _nice(max(values, default=0) or 1)
    times = list(edges)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="loom-ops-chart" viewBox="0 0 {W} {H}" width="{W}" '
             f'height="{H}" role="img" aria-label="{escape(title)}"><title>{escape(title)}</title>',
             f'<rect width="{W}" height="{H}" fill="#fff"/>']
    if not times:
        parts.append(f'<text x="{W / 2}" y="{H / 2}" text-anchor="middle" font-size="13">nothing in this window</text>')
        return "".join(parts) + "</svg>"
    lo, hi = times[0].timestamp(), times[-1].timestamp()

    def px(t: datetime) -> float:
        return LEFT + (W - LEFT - RIGHT) * ((t.timestamp() - lo) / ((hi - lo) or 1))

    def py(v: float) -> float:
        return H - BOTTOM - (H - BOTTOM - TOP) * (v / top)

    for i in range(5):
        v = top * i / 4
        parts.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{py(v):.1f}" y2="{py(v):.1f}" stroke="#e5e7eb"/>'
                     f'<text x="{LEFT - 5}" y="{py(v) + 4:.1f}" text-anchor="end" font-size="11">{v:g}</text>')
    for i, t in enumerate(times):
        if i % max(1, len(times) // 6) == 0 or i == len(times) - 1:
            anchor = "end" if i == len(times) - 1 else "start" if i == 0 else "middle"  # inside the frame
            parts.append(f'<text x="{px(t):.1f}" y="{H - BOTTOM + 15}" text-anchor="{anchor}" font-size="11">'
                         f'{t.astimezone(UTC):%H:%M}</text>')
    parts.append(f'<text x="{(LEFT + W) / 2}" y="{H - 4}" text-anchor="middle" font-size="11">UTC, bucket end</text>'
                 f'<text transform="translate(12 {(TOP + H - BOTTOM) / 2}) rotate(-90)" text-anchor="middle" '
                 f'font-size="11">{escape(y_label)}</text>')
    x = LEFT
    for j, s in enumerate(series):
        color = PALETTE[j % len(PALETTE)]
        pts = [(px(t), py(v), t, v) for t, v in s.points]
        index = {t: i for i, t in enumerate(times)}
        run: list[tuple[float, float]] = []
        for k, (a, b, t, _) in enumerate(pts):  # one polyline per run of adjacent buckets
            if k and index.get(t, -9) != index.get(pts[k - 1][2], -9) + 1:
                run = _flush(parts, run, color)
            run.append((a, b))
        _flush(parts, run, color)
        for a, b, t, v in pts:
            parts.append(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="2.5" fill="{color}"><title>{escape(s.name)} '
                         f'{t.astimezone(UTC):%H:%M}: {v:g}</title></circle>')
        parts.append(f'<line x1="{x}" x2="{x + 14}" y1="14" y2="14" stroke="{color}" stroke-width="3"/>'
                     f'<text x="{x + 18}" y="18" font-size="12">{escape(s.name[:30])}</text>')
        x += 30 + 7 * len(s.name[:30])
        if x > W - 80:
            break  # more series than the legend's one line: the rest stay in the chart, named by their tooltips
    return "".join(parts) + "</svg>"


def _flush(parts: list[str], run: list[tuple[float, float]], color: str) -> list:
    if len(run) > 1:
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="'
                     + " ".join(f"{a:.1f},{b:.1f}" for a, b in run) + '"/>')
    return []


def _user_can(request, perm: str) -> None:
    if not request.user.has_perm(perm):
        raise PermissionDenied(f"needs the {perm} permission")


def _act(request) -> None:
    """One POSTed action; its outcome (or refusal) as a message."""

    action, name = request.POST.get("action", ""), request.POST.get("name", "")
    who = f"{request.user.get_username()} (admin)"
    try:
        if action in ("pause_queue", "resume_queue"):
            _user_can(request, "queues.pause_queue")
            out = pause.pause(name, who) if action == "pause_queue" else pause.resume(name)
            said = ("paused" if out.paused else "resumed") if out.changed else (
                "already paused" if out.paused else "was not paused")
            messages.success(request, f"queue {name}: {said}")
        elif action == "drain_worker":
            _user_can(request, "leases.drain_worker")
            out = drain.request(name, who)
            messages.success(request, f"worker {name}: " + ("asked to drain: it finishes its runs and exits"
                                                            if out.new else "already asked to drain"))
        elif action in ("run_schedule", "pause_schedule", "resume_schedule", "backfill_schedule"):
            _user_can(request, "leases.operate_schedule")
            if action == "run_schedule":
                messages.success(request, f"schedule {name}: queued {ops.run_now(name, who)}")
            elif action == "pause_schedule":
                messages.success(request, f"schedule {name}: " + ("paused" if ops.pause(name, who) else
                                                                   "already paused"))
            elif action == "resume_schedule":
                messages.success(request, f"schedule {name}: " + ("resumed" if ops.resume(name) else
                                                                   "was not paused"))
            else:
                start, end = (_when(request.POST.get(k, ""), k) for k in ("start", "end"))
                done = ops.backfill(name, start, end, who)
                messages.success(request, done.summary())
        else:
            messages.error(request, f"unknown action {action!r}: nothing done")
    except (QueueError, drain.UnknownWorker, InvalidSchedule) as exc:
        messages.error(request, f"{action} {name}: nothing done: {type(exc).__name__}: {exc}")
    except Exception as exc:
        if not cannot_reach(exc):
            raise
        # A shard down mid-action: the databases before it in LOOM_SHARDS may have taken it (a resume writes
        # each shard in turn), so the page says so rather than "nothing done", and never answers 500.
        said = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        messages.error(request, f"{action} {name}: a database could not be reached ({said}): done on none or only "
                                "some of the databases; repeat it once that database answers")


def _when(text: str, what: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidSchedule(f"backfill {what}: an ISO time (2026-12-01T10:00, UTC unless it says), not {text!r}"
                              ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def operations_view(admin_site, request):
    """GET: the page; POST: one action, then back to the page (its figures as they are after it)."""
    if not request.user.has_perm("queues.view_queue"):
        raise PermissionDenied
    if request.method == "POST":
        _act(request)
        return HttpResponseRedirect(request.get_full_path())

    window = request.GET.get("window", "hour")
    window = window if window in operations.WINDOWS else "hour"
    edges = operations.bucket_edges(window)
    unreachable: dict[str, str] = {}  # a shard that cannot be read: left out of every figure, and named
    done, rate = operations.throughput_series(window, edges=edges, unreachable=unreachable)
    width = "5 min" if window == "hour" else "1 h"
    depth = operations.depth_series(window, edges=edges, unreachable=unreachable)
    charts = [("Queue depth (pending entries)", svg_chart(f"Queue depth, last {window}", depth, "pending", edges)),
              (f"Throughput (executions finished per {width})",
               svg_chart(f"Executions finished, last {window}", done, f"per {width}", edges)),
              ("Failure rate (failed / finished)", svg_chart(f"Failure rate, last {window}", rate, "% failed", edges,
                                                             100.0))]
    perms = request.user
    context = {**admin_site.each_context(request), "title": "Operations", "window": window,
               "windows": list(operations.WINDOWS), "charts": charts,
               "queues": operations.queues(unreachable=unreachable),
               "workers": operations.workers(unreachable=unreachable),
               "troubled": operations.troubled(unreachable=unreachable),
               "schedules": list(Schedule.objects.order_by("name")[:200]), "stamp": stamp,
               "can_pause": perms.has_perm("queues.pause_queue"), "can_drain": perms.has_perm("leases.drain_worker"),
               "can_schedule": perms.has_perm("leases.operate_schedule"),
               "execution_url": reverse("admin:journal_execution_changelist")}
    for alias, reason in unreachable.items():  # as the sharded lists say it (journal/admin_shards.py)
        messages.error(request, f"Shard “{alias}” could not be read ({reason}): its queue entries, executions and "
                                "leases are not in these figures; the other shards' are.")
    return TemplateResponse(request, "queues/operations.html", context)
