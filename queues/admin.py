"""Admin: the queues, and each queue's entries (the queue page: queued starts, pending and started).

The Queue list shows what an operator asks first: how many run (against the cap), how many wait (depth),
the per-partition cap and the rate limit. Caps are declared in settings or code (LOOM_QUEUES,
declare_queue) and written to the rows by the workers, so nothing here edits them. The figures come from
the queues store (`queues.stats`: one statement for every queue), taken once per page. Each queue links
to its entries (pending and started), to its executions and to its queued executions (executions list).

The entries list (QueueEntry): who claimed each entry (worker), since when (enqueued, claimed, begun),
attempts, partition key, priority and not-before time, filtered by queue and state, each linked to its
execution's page. Its two actions have their own permissions (view-only staff see no action):
- cancel (queues.cancel_queueentry), after a confirmation page: the entry's start never happens
  (queues/entries.py; its queued execution is cancelled too); an entry a worker began is not touched
  ("cancel the execution instead"); each row's outcome is said as it happened;
- reprioritise (queues.reprioritise_queueentry), a form: a priority -100..100 on the pending entries;
  the others are named and left as they are.
Both act on the rows ticked, each on its shard (journal/admin_shards.py); the SQL is the store's.
"""

from __future__ import annotations

from contextvars import ContextVar
from urllib.parse import urlencode

import django
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join

import queues
from journal.admin import execution_url
from journal.admin_base import ReadOnlyAdmin, add_execution_filter, add_execution_panel
from journal.admin_shards import ShardedRows, pick_value
from journal.timestamps import stamp
from queues import entries as ops
from queues import pause
from queues.models import CANCELLED, DONE, LIVE, PENDING, STARTED, Queue, QueueEntry
from queues.operations_admin import operations_view

BULK_LIMIT = 500  # rows one action acts on; the rest of a larger selection is named, never dropped silently

_stats: ContextVar[dict | None] = ContextVar("loom_queue_stats", default=None)


def _figures(queue: Queue):
    """The queue's stats row: taken once for the page being rendered (this request's context), else now."""

    found = _stats.get()
    if found is None or queue.pk not in found:  # every shard's figures added up, as on the list
        found = {row.name: row for row in queues.stats(unreachable={})}  # an unreachable shard's left out
    return found.get(queue.pk)


@admin.register(Queue)
class QueueAdmin(ReadOnlyAdmin):
    list_display = ("name", "dispatch", "running", "cap", "depth", "ready", "partition_cap", "rate", "executions",
                    "entries")
    fields = ("name", "dispatch", "running", "cap", "depth", "ready", "partition_cap", "rate", "updated_at",
              "executions", "entries")
    readonly_fields = fields
    search_fields = ("name",)
    # Pause and resume (queues/pause.py), with their own permission (queues.pause_queue): reversible, so no
    # confirmation page; each queue's outcome is said as it happened.
    actions = ("pause_queues", "resume_queues")
    # One row per queue, not per shard: a queue's row is on every shard (each counts its own caps), so one
    # database's rows name them all; the figures are every shard's added up (queues.stats), list and page.
    rows_per_shard = False

    def changelist_view(self, request, extra_context=None):
        unreachable: dict[str, str] = {}
        token = _stats.set({row.name: row for row in queues.stats(unreachable=unreachable)})
        for alias, reason in unreachable.items():  # the other shards' figures are still shown, added up
            self.message_user(request, f"Shard “{alias}” could not be read ({reason}): its queue figures are not "
                                       "in these sums.", messages.ERROR)
        try:
            response = super().changelist_view(request, extra_context)
            if hasattr(response, "render"):
                response.render()  # the rows' figures are read while the context still holds them
            return response
        finally:
            _stats.reset(token)

    def get_urls(self):
        from django.urls import path

        view = self.admin_site.admin_view(lambda request: operations_view(self.admin_site, request))
        return [path("operations/", view, name="queues_operations"), *super().get_urls()]

    def has_pause_permission(self, request, obj=None) -> bool:
        return request.user.has_perm("queues.pause_queue")

    @admin.display(description="dispatch")
    def dispatch(self, queue) -> str:
        """Running or paused, linked to the operations page (charts, workers, the actions)."""
        text = "running" if queue.paused_at is None else (
            f"paused since {stamp(queue.paused_at)}" + (f" by {queue.paused_by}" if queue.paused_by else ""))
        return format_html('<a href="{}" title="the operations page">{}</a>', reverse("admin:queues_operations"), text)

    @admin.action(description="Pause selected queues (no worker takes their entries; enqueues still accepted)",
                  permissions=["pause"])
    def pause_queues(self, request, queryset):
        by = f"{request.user.get_username()} (admin)"
        for name in queryset.values_list("name", flat=True)[:BULK_LIMIT]:
            out = pause.pause(name, by)
            messages.success(request, f"queue {name}: paused" if out.changed else f"queue {name}: already paused")

    @admin.action(description="Resume selected queues", permissions=["pause"])
    def resume_queues(self, request, queryset):
        for name in queryset.values_list("name", flat=True)[:BULK_LIMIT]:
            out = pause.resume(name)
            messages.success(request, f"queue {name}: resumed" if out.changed else f"queue {name}: was not paused")

    @admin.display(description="running")
    def running(self, queue) -> int:
        row = _figures(queue)
        return row.running if row else 0

    @admin.display(description="cap")
    def cap(self, queue) -> int:
        return queue.concurrency

    @admin.display(description="depth (pending)")
    def depth(self, queue) -> int:
        row = _figures(queue)
        return row.pending if row else 0

    @admin.display(description="ready now")
    def ready(self, queue) -> int:
        row = _figures(queue)
        return row.ready if row else 0

    @admin.display(description="per partition")
    def partition_cap(self, queue) -> str:
        return str(queue.partition_concurrency) if queue.partition_concurrency else "-"

    @admin.display(description="rate limit")
    def rate(self, queue) -> str:
        return f"{queue.rate_limit} per {queue.rate_period:g} s" if queue.rate_limit else "-"

    @admin.display(description="executions")
    def executions(self, queue) -> str:
        url = reverse("admin:journal_execution_changelist")
        return format_html('<a href="{}?queue={}">executions of {}</a> · '
                           '<a href="{}?queue={}&amp;status__exact=queued">queued executions</a>',
                           url, queue.name, queue.name, url, queue.name)

    @admin.display(description="entries")
    def entries(self, queue) -> str:
        return format_html('<a href="{}">entries of {}</a>', entries_url(queue.name), queue.name)


def entries_url(queue: str, state: str = "live") -> str:
    """The queue's page: its entries list, filtered by queue and (default) the live states."""
    return f"{reverse('admin:queues_queueentry_changelist')}?{urlencode({'queue': queue, 'state': state})}"


class EntryQueueFilter(admin.SimpleListFilter):
    """By queue name (?queue=, as the executions list's filter)."""

    title = "queue"
    parameter_name = "queue"

    def lookups(self, request, model_admin):
        return [(name, name) for name in Queue.objects.order_by("name").values_list("name", flat=True)[:200]]

    def queryset(self, request, queryset):
        return queryset.filter(queue_id=self.value()) if self.value() else queryset


class EntryStateFilter(admin.SimpleListFilter):
    """By state; "live" is pending or started (the queue page's default link)."""

    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return [("live", "pending or started"), (PENDING, "pending"), (STARTED, "started"), (DONE, "done"),
                (CANCELLED, "cancelled")]

    def queryset(self, request, queryset):
        value = self.value()
        if not value:
            return queryset
        return queryset.filter(state__in=LIVE) if value == "live" else queryset.filter(state=value)


@admin.register(QueueEntry)
class QueueEntryAdmin(ReadOnlyAdmin):
    list_display = ("execution", "flow", "queue_name", "state", "worker", "enqueued", "claimed", "begun", "attempts",
                    "partition_key", "priority", "not_before")
    list_filter = (EntryQueueFilter, EntryStateFilter)
    search_fields = ("execution_id", "flow", "partition_key", "dedup_id")
    withheld_lookups = ("input", "meta")  # an old entry's input (and any meta) may hold personal data: no filter
    fields = ("execution", "flow", "queue_name", "state", "worker", "enqueued", "claimed", "begun", "finished",
              "attempts", "partition_key", "priority", "not_before", "dedup_id")
    readonly_fields = fields
    ordering = ("-priority", "id")  # start order: what a worker claims next comes first
    actions = ("cancel_entries", "reprioritise_entries")
    list_per_page = 100
    show_full_result_count = False  # no count(*) over a large table on every page

    # -- permissions -------------------------------------------------------------------------------
    def has_cancel_permission(self, request, obj=None) -> bool:
        return request.user.has_perm("queues.cancel_queueentry")

    def has_reprioritise_permission(self, request, obj=None) -> bool:
        return request.user.has_perm("queues.reprioritise_queueentry")

    # -- columns -------------------------------------------------------------------------------------
    @admin.display(description="execution", ordering="execution_id")
    def execution(self, entry: QueueEntry) -> str:
        return format_html('<a href="{}">{}</a>', execution_url(entry.execution_id), entry.execution_id)

    @admin.display(description="queue", ordering="queue_id")
    def queue_name(self, entry: QueueEntry) -> str:
        return entry.queue_id  # the column, not the row (one query per entry)

    @admin.display(description="enqueued", ordering="enqueued_at")
    def enqueued(self, entry: QueueEntry) -> str:
        return stamp(entry.enqueued_at)

    @admin.display(description="claimed", ordering="started_at")
    def claimed(self, entry: QueueEntry) -> str:
        return stamp(entry.started_at) or "-"

    @admin.display(description="begun")
    def begun(self, entry: QueueEntry) -> str:
        return stamp(entry.begun_at) or "-"

    @admin.display(description="finished")
    def finished(self, entry: QueueEntry) -> str:
        return stamp(entry.finished_at) or "-"

    @admin.display(description="not before", ordering="run_after")
    def not_before(self, entry: QueueEntry) -> str:
        return stamp(entry.run_after)

    # -- actions: a page says what will happen, then "Yes" does it ------------------------------------
    def _selected(self, request, queryset) -> tuple[list[QueueEntry], int]:
        """The ticked entries on every shard (each row knows its shard), at most BULK_LIMIT, and how many more."""
        rows = ShardedRows(self.selection(request, queryset))
        found = list(rows[:BULK_LIMIT])
        return found, max(0, rows.count() - len(found))

    def _context(self, request, verb: str, action: str, selected: list, left: int, **extra) -> dict:
        opts = self.model._meta
        crumbs = [(opts.app_config.verbose_name, reverse("admin:app_list", args=[opts.app_label])),
                  ("Queue entries", reverse("admin:queues_queueentry_changelist")), (verb.capitalize(), None)]
        return {**self.admin_site.each_context(request), "opts": opts, "verb": verb, "action": action,
                "title": f"{verb.capitalize()} queue entries?", "picked": [pick_value(e) for e in selected],
                "action_checkbox_name": ACTION_CHECKBOX_NAME, "left": left, "limit": BULK_LIMIT,
                "crumbs": crumbs, "ol_breadcrumbs": django.VERSION >= (6, 0), **extra}

    @admin.action(description="Cancel selected entries (their starts never happen)", permissions=["cancel"])
    def cancel_entries(self, request, queryset):
        entries, left = self._selected(request, queryset)
        if request.POST.get("post") == "yes":
            reason = f"cancelled by {request.user.get_username()} in the admin (queue entry)"
            done = []
            for entry in entries:
                try:
                    done.append(ops.cancel_entry(entry.execution_id, entry._state.db, reason))
                except Exception as exc:  # shown to the operator, never a 500; the other rows go on
                    messages.error(request, f"cancel {entry.execution_id}: nothing done: {type(exc).__name__}: {exc}")
            self._say(request, done)
            if not entries:
                messages.info(request, "cancel: nothing selected")
            if left:
                messages.warning(request, f"cancel: {left} more selected entr(ies) were not touched (at most "
                                          f"{BULK_LIMIT} per action): run it again for them")
            return None
        rows = []
        for alias in dict.fromkeys(entry._state.db for entry in entries):
            here = [entry for entry in entries if entry._state.db == alias]
            status = ops.statuses([entry.execution_id for entry in here], alias)
            rows += [(entry, ops.plan_cancel(entry.state, entry.begun_at is not None,
                                             status.get(entry.execution_id), entry.execution_id)) for entry in here]
        return TemplateResponse(request, "queues/entry_action_confirm.html", self._context(
            request, "cancel", "cancel_entries", entries, left, rows=rows, any_will=any(p.will for _, p in rows)))

    def _say(self, request, done: list[ops.Plan]) -> None:
        """One message per outcome, naming every row it is true of (a running one links to its execution)."""
        cancelled = [plan for plan in done if plan.kind == ops.CANCEL]
        running = [plan for plan in done if plan.kind == ops.RUNNING]
        finished = [plan for plan in done if plan.kind == ops.FINISHED]
        if cancelled:
            messages.success(request, format_html("cancelled, they never start: {}", format_html_join(
                ", ", "{}{}", ((p.execution_id, " (and its queued execution)" if "queued execution" in p.text else "")
                               for p in cancelled))))
        if running:
            messages.warning(request, format_html("not cancelled, already running — cancel the execution instead: {}",
                                                  format_html_join(", ", '<a href="{}">{}</a>', (
                                                      (execution_url(p.execution_id), p.execution_id)
                                                      for p in running))))
        if finished:
            messages.info(request, format_html("not cancelled, already finished: {}", format_html_join(
                ", ", "{} ({})", ((p.execution_id, p.text.removeprefix("nothing: already finished ").strip("()"))
                                  for p in finished))))

    @admin.action(description="Reprioritise selected pending entries", permissions=["reprioritise"])
    def reprioritise_entries(self, request, queryset):
        entries, left = self._selected(request, queryset)
        problem = None
        if request.POST.get("post") == "yes":
            try:
                priority = ops.check_priority(request.POST.get("priority", ""))
            except ValueError as exc:
                problem = str(exc)  # the form again, nothing written
            else:
                by_shard: dict[str, list[int]] = {}
                for entry in entries:
                    by_shard.setdefault(entry._state.db, []).append(entry.pk)
                changed = set(ops.set_priority(by_shard, priority))
                done = [e.execution_id for e in entries if (e._state.db, e.pk) in changed]
                refused = [e for e in entries if (e._state.db, e.pk) not in changed]
                if done:
                    messages.success(request, f"priority {priority} set on: {', '.join(done)}")
                if refused:
                    messages.warning(request, "priority unchanged, not pending (only a pending entry's start order "
                                              "can change): " + ", ".join(
                                                  f"{e.execution_id} ({_state_now(e)})" for e in refused))
                if left:
                    messages.warning(request, f"reprioritise: {left} more selected entr(ies) were not touched (at "
                                              f"most {BULK_LIMIT} per action): run it again for them")
                return None
        return TemplateResponse(request, "queues/entry_reprioritise.html", self._context(
            request, "reprioritise", "reprioritise_entries", entries, left, entries=entries, problem=problem,
            priority=request.POST.get("priority", ""), any_pending=any(e.state == PENDING for e in entries)))


def _state_now(entry: QueueEntry) -> str:
    """The entry's state as it is now (it may have been claimed while the form was open)."""
    now = QueueEntry.objects.using(entry._state.db).filter(pk=entry.pk).values_list("state", flat=True).first()
    return now or "gone"


def entry_summary(execution_id: str) -> str:
    """The execution page's queue line (journal's panel hook): its entry's queue, state, priority, worker."""

    entry = queues.entry_of(execution_id)
    if entry is None:
        return "not queued"
    who = f", claimed by {entry.worker} at {stamp(entry.started_at)}" if entry.worker else ""
    return format_html('queue <a href="{}">{}</a>, entry {}, priority {}, attempts {}{}', entries_url(entry.queue_id),
                       entry.queue_id, entry.state, entry.priority, entry.attempts, who)


add_execution_panel("queue", "queue entry", entry_summary)


class QueueFilter(admin.SimpleListFilter):
    """The executions list's queue filter: an execution's queue is its entry (QueueEntry, joined by
    execution id: no foreign key between the apps)."""

    title = "queue"
    parameter_name = "queue"

    def lookups(self, request, model_admin):
        return [(name, name) for name in Queue.objects.order_by("name").values_list("name", flat=True)[:200]]

    def queryset(self, request, queryset):
        value = self.value()
        if not value:
            return queryset
        return queryset.filter(pk__in=QueueEntry.objects.filter(queue_id=value).values("execution_id"))


add_execution_filter("queue", QueueFilter, place=40)
