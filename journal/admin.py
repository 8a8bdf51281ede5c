"""The journal in the admin: executions with their timeline, and the log, read-only.

The log is append-only, so the admin never adds, changes or deletes events, fences or snapshots;
execution headers are written by the runtime only. What an operator may do to an execution goes
through journal.flows, under Django's model permissions (journal.resume_execution,
journal.cancel_execution, journal.retry_execution; viewing needs journal.view_execution):

- resume: handed to a worker (journal.flows.hand_over), never run in the web request; refused
  while another process provably drives the execution, unless forced on a confirmation page;
- retry (a failed execution): a new attempt recorded in its log, handed to a worker;
- cancel: recorded as EXECUTION_CANCELLED, after a confirmation page.

Flows that wait (issue 17) add, each under its own permission (journal.wake_execution,
journal.message_execution, journal.suspend_execution, journal.fork_execution):

- wake now (a waiting execution): its wait is due at once (journal.flows.wake_now); a worker's waker
  resumes it, never the web request;
- send message: a form (topic, JSON payload, optional message id) that journal.flows.send records;
- suspend (after a confirmation page): no lease, no wait, no worker until someone resumes it (the
  Resume button, which hands it to a worker);
- fork (a form: from which step): a new execution reusing the recorded steps before it.

The page of a waiting execution says what it waits for (timer due at, topic, child) and lists the
messages kept for it that no recv has consumed yet.

Bulk actions show a page that lists what will happen to each selected execution before anything
is done. Ids are unquoted the way the admin quotes them (order_42, ids with / or :).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import django
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.options import IS_POPUP_VAR
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.db.models import Count, OuterRef, Subquery
from django.http import Http404, HttpRequest, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html

from journal import shards
from journal.admin_base import ReadOnlyAdmin, SafeChangeList, execution_filters, panel_fields
from journal.admin_filters import FlowFilter
from journal.admin_shards import UNREACHABLE, ShardedRows, ShardUnreachable, pick_value
from journal.aggregates.admin import AggregateAdmin
from journal.exceptions import ForgetIncomplete
from journal.ids import stored_id_problem
from journal.models import AggregateStream, Compaction, DataKey, Event, Execution, Fence, Removal, Snapshot
from journal.privacy import Reader, reader_for_user
from journal.timestamps import stamp

VERBS = ("resume", "retry", "cancel", "wake", "suspend", "message", "fork")
FORMS = ("message", "fork")  # verbs whose confirmation page is a form with fields
CONFIRMED = ("cancel", "suspend", *FORMS)  # verbs that act only after their confirmation page
UNSETTLED = ("queued", "running", "stuck", "waiting", "suspended")
BULK_LIMIT = 500  # rows one bulk action acts on; the rest of a larger selection is named, never dropped silently


def plan(execution: Execution, verb: str, force: bool = False) -> tuple[bool, str]:
    """(will act, what will happen) for one execution: shown before a bulk action or a button runs."""
    from journal.flows import ownership

    status = execution.status
    if verb == "wake":
        if status == "waiting":
            return True, "its wait ends now (recorded as WAIT_WOKEN); a worker's waker resumes it"
        return False, f"nothing: only a waiting execution can be woken (this one is {status})"
    if verb == "message":
        if status in ("queued", "running", "waiting", "suspended"):
            return True, ("the message is kept until the flow receives it on its topic (once); "
                          "a flow waiting on it wakes")
        return False, f"nothing: a {status} execution receives no more messages"
    if verb == "fork":
        return True, ("a new execution of the same flow and input: the steps before the one you choose are "
                      "reused from this log, the rest run again on a worker")
    if verb == "suspend":
        if status not in ("running", "stuck", "waiting"):
            return False, f"nothing: already {status}"
        holder = ownership.live_owner(execution.pk) if status == "running" else None
        if holder is not None and not force:
            return False, f"refused: running under {holder} (force it from the execution's page)"
        if holder is not None:
            return True, f"FORCED: fences off the run of {holder} (it stops at its next step), then suspends"
        return True, "will be suspended: no lease, no wait, no worker until someone resumes it"
    if verb == "cancel":
        if status in UNSETTLED:
            holder = ownership.live_owner(execution.pk) if status == "running" else None
            if status == "queued":
                return True, "will be cancelled at once (EXECUTION_CANCELLED); its queue entry never begins"
            if holder is None:
                return True, "will be cancelled at once (EXECUTION_CANCELLED); no run is in progress"
            return True, (f"will be cancelled (EXECUTION_CANCELLED); the step running under {holder} "
                          f"{_cancel_bound_text()}")
        return False, f"nothing: already {status}"
    if verb == "retry":
        if status == "failed":
            return True, "a new attempt from its last completed step, recorded in its log, handed to a worker"
        return False, f"nothing: only a failed execution can be retried (this one is {status})"
    if status == "waiting":
        return False, "nothing: it is waiting (wake it now instead, or let its wait come due)"
    if status not in ("running", "stuck", "suspended"):
        return False, f"nothing: already {status}"
    holder = ownership.live_owner(execution.pk) if status != "suspended" else None
    if holder is not None and not force:
        return False, f"refused: running under {holder} (force it from the execution's page)"
    if holder is not None:
        return True, f"FORCED: takes it over from {holder} (its in-flight step may run twice), handed to a worker"
    return True, "handed to a worker, which takes a new fence and continues from the log"


def act(request: HttpRequest, execution_id: str, verb: str, force: bool = False, fields: dict | None = None) -> bool:
    """Do one verb through journal.flows; the outcome becomes a message (never a 500).

    `fields` carries a form verb's checked values (message: topic, payload, message_id; fork:
    from_step, new_id)."""
    from journal import flows
    from journal.flows import cancel, hand_over
    from journal.flows.runtime import retry

    actor = request.user.get_username()
    fields = fields or {}
    try:
        if verb == "wake":
            woke = flows.wake_now(execution_id)
            text = (f"wake {execution_id}: its wait ends now; a worker resumes it" if woke
                    else f"wake {execution_id}: nothing to do, it was not waiting")
        elif verb == "suspend":
            out = flows.suspend(execution_id, force=force, reason=f"suspended by {actor} in the admin")
            text = f"suspend {execution_id}: {out.status}" + (" [forced]" if force else "")
        elif verb == "message":
            sent = flows.send(execution_id, fields["topic"], fields["payload"], message_id=fields.get("message_id"))
            text = f"message {sent} on topic {fields['topic']!r} sent to {execution_id}"
        elif verb == "fork":
            new_id = flows.fork(execution_id, fields["from_step"], fields.get("new_id"))
            text = f"fork {execution_id} from step {fields['from_step']}: new execution {new_id}, handed to a worker"
        elif verb == "resume":
            token = hand_over(execution_id, force=force)
            text = f"resume {execution_id}: handed over to a worker (from fence {token})"
            text += " [forced]" if force else ""
        elif verb == "retry":
            retry(execution_id, actor=actor, handoff=True)
            text = f"retry {execution_id}: a new attempt was recorded and handed over to a worker"
        else:
            from journal.flows import ownership
            from journal.flows.writer import header_status

            holder = ownership.live_owner(execution_id)  # before: the cancel's fence ends whoever drives it
            before = header_status(execution_id)
            out = cancel(execution_id, f"cancelled by {actor} in the admin")
            if before is not None and before[0] == "queued":
                text = f"cancel {execution_id}: {out.status} at once (it was queued: its entry never begins)"
            elif holder is None:
                text = f"cancel {execution_id}: {out.status} at once (no run was in progress)"
            else:
                text = f"cancel {execution_id}: {out.status}; the step running under {holder} {_cancel_bound_text()}"
    except Exception as exc:  # shown to the operator, never a 500
        messages.error(request, f"{verb} {execution_id}: {type(exc).__name__}: {exc}")
        return False
    messages.success(request, text)
    return True


def _cancel_bound_text() -> str:
    """What a cancel does to a step that runs right now, elsewhere (journal/flows/interrupt.py)."""
    from journal.flows.interrupt import cancel_bound

    bound = cancel_bound()
    if bound is None:
        return "is not told (no leases): its run stops at its next step boundary"
    return (f"is told to stop and stops within {bound:g} s (a step that ignores it is abandoned and its worker "
            f"process replaced); its result is never recorded")


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


class CreatedFilter(admin.DateFieldListFilter):
    """Created today / in the last 7 days / this month / this year; any other range is the URL's
    `created_at__gte=2026-12-01&created_at__lt=2026-12-02` (ISO dates or times, UTC), which this filter reads."""

    title = "created (date range)"

    def queryset(self, request, queryset):
        """The range's bounds read as UTC when they name no zone (a naive bound would be a warning, and a
        different instant per server time zone); a bound that is no ISO date or time is the admin's "?e=1"."""
        from datetime import UTC, datetime

        from django.contrib.admin.options import IncorrectLookupParameters

        bounds = {}
        for key, value in self.used_parameters.items():
            text = value[-1] if isinstance(value, list) else value
            try:
                moment = datetime.fromisoformat(str(text).strip())
            except ValueError as exc:
                raise IncorrectLookupParameters(exc) from exc
            bounds[key] = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
        return queryset.filter(**bounds)


class StatusFilter(admin.ChoicesFieldListFilter):
    """Every status an execution can have (waiting and suspended are set since flows can wait), and
    "queued" (a start accepted onto a queue that no worker has begun, issue 24) even where the model's
    choices do not name it yet: the list's "queued" choice and the queue page's link select it."""

    EXTRA = (("queued", "Queued"),)

    def choices(self, changelist):
        known = {str(value) for value, _ in self.field.flatchoices}
        for i, choice in enumerate(super().choices(changelist)):
            yield choice
            if i:
                continue
            for value, title in self.EXTRA:  # after "All"
                if value not in known:
                    yield {"selected": self.lookup_val is not None and value in self.lookup_val,
                           "query_string": changelist.get_query_string({self.lookup_kwarg: value},
                                                                       [self.lookup_kwarg_isnull]),
                           "display": title}


@admin.register(Execution)
class ExecutionAdmin(SafeChangeList, ReadOnlyAdmin):
    list_display = ("id", "flow_name", "flow_version", "status", "progress", "duration", "created", "finished",
                    "error_column", "recoveries", "shard")
    list_filter = (("status", StatusFilter), FlowFilter, "flow_version", ("created_at", CreatedFilter))
    # + the apps' (add_execution_filter: queues its queue filter, leases its schedule filter)
    search_fields = ("id", "flow", "input", "error")  # journal/search.py: get_search_results below
    search_help_text = "Id, flow, a value of the input, or a part of the error text (docs/backends.md: indexes)."
    withheld_lookups = ("input", "result", "error")  # a viewer may see their sensitive fields redacted
    readonly_fields = ("id", "flow", "flow_version", "status", "input_json", "result_json", "error_or_reason",
                       "recoveries", "created", "updated", "finished")
    fields = readonly_fields  # and the panels other apps add (journal.admin_base.add_execution_panel)
    actions = ("resume_executions", "retry_executions", "cancel_executions", "wake_executions",
               "suspend_executions")
    change_form_template = "journal/execution_change_form.html"
    change_list_template = "journal/execution_change_list.html"  # + a link to the flow versions page
    list_per_page = 50
    show_full_result_count = False  # no count(*) over a large table on every page

    # -- permissions -------------------------------------------------------------------------------
    def has_resume_permission(self, request, obj=None) -> bool:
        return request.user.has_perm("journal.resume_execution")

    def has_retry_permission(self, request, obj=None) -> bool:
        return request.user.has_perm("journal.retry_execution")

    def has_cancel_permission(self, request, obj=None) -> bool:
        return request.user.has_perm("journal.cancel_execution")

    def has_wake_permission(self, request, obj=None) -> bool:
        return request.user.has_perm("journal.wake_execution")

    def has_suspend_permission(self, request, obj=None) -> bool:
        return request.user.has_perm("journal.suspend_execution")

    def has_message_permission(self, request, obj=None) -> bool:
        return request.user.has_perm("journal.message_execution")

    def has_fork_permission(self, request, obj=None) -> bool:
        return request.user.has_perm("journal.fork_execution")

    def may(self, request, verb: str) -> bool:
        return getattr(self, f"has_{verb}_permission")(request)

    # -- list (every shard's executions, a shard column: journal/admin_shards.py) ---------------------
    def find_shard(self, object_id: str) -> str | None:
        """An execution's shard is its id's placement (journal/shards.py), no probing."""
        return None if stored_id_problem(object_id) is not None else shards.shard_for(object_id)

    def get_queryset(self, request):
        done = (Event.objects.filter(stream_id=OuterRef("pk"), type="STEP_COMPLETED").order_by()
                .values("stream_id").annotate(n=Count("id")).values("n"))
        return super().get_queryset(request).annotate(steps_done=Subquery(done))

    @admin.display(description="flow", ordering="flow")
    def flow_name(self, execution) -> str:
        """A Django task's dotted name for `loom.task` (its signed path, journal/task_names.py), else the flow."""
        from journal.task_names import shown_flow

        return shown_flow(execution.flow, execution.input, execution.pk)

    def get_search_results(self, request, queryset, search_term):
        """One search over id, flow, input text and error text (journal/search.py), not Django's per-field
        `icontains` on a JSON column (which differs by backend)."""
        from journal.search import search

        return search(queryset, search_term), False

    @admin.display(description="error")
    def error_column(self, execution) -> str:
        """The first line of the error (a cancel's reason is not an error: shown as such)."""
        from journal.search import error_line

        if not execution.error:
            return "-"
        if execution.status == "cancelled":
            return f"(cancelled: {error_line(execution.error, 80)})"
        return error_line(execution.error)

    @admin.display(description="steps done")
    def progress(self, execution) -> str:
        n = getattr(execution, "steps_done", None) or 0
        return f"{n} step{'s' if n != 1 else ''}" + (" so far" if execution.status == "running" else "")

    @admin.display(description="duration")
    def duration(self, execution) -> str:
        unsettled = execution.status in UNSETTLED  # running, or parked: its time goes on (not until it parked)
        end = execution.finished_at or (timezone.now() if unsettled else execution.updated_at)
        seconds = max(0.0, (end - execution.created_at).total_seconds())
        text = f"{seconds:.3f} s" if seconds < 60 else f"{int(seconds // 60)} min {seconds % 60:.3f} s"
        return text + (f" ({execution.status}, so far)" if unsettled else "")

    @admin.display(description="created", ordering="created_at")
    def created(self, execution) -> str:
        return stamp(execution.created_at)

    @admin.display(description="finished", ordering="finished_at")
    def finished(self, execution) -> str:
        return stamp(execution.finished_at) or "-"

    @admin.display(description="updated")
    def updated(self, execution) -> str:
        return stamp(execution.updated_at)

    @admin.display(description="error (or cancel reason)")
    def error_or_reason(self, execution) -> str:
        """A cancel's reason is not an error: said to be a reason (issue #28)."""
        if not execution.error:
            return "-"
        if execution.status == "cancelled":
            return f"cancel reason: {execution.error}"
        return execution.error

    @admin.display(description="input")
    def input_json(self, execution) -> str:
        return format_html("<pre>{}</pre>", _json(execution.input))

    @admin.display(description="result")
    def result_json(self, execution) -> str:
        return format_html("<pre>{}</pre>", _json(execution.result))

    def get_list_filter(self, request):
        return (*super().get_list_filter(request), *execution_filters())

    def get_fields(self, request, obj=None):
        return (*super().get_fields(request, obj), *panel_fields())

    def get_readonly_fields(self, request, obj=None):
        return (*super().get_readonly_fields(request, obj), *panel_fields())

    # -- bulk actions: a page lists what will happen, then "Yes" does it ------------------------------
    @admin.action(description="Resume selected executions (handed to a worker)", permissions=["resume"])
    def resume_executions(self, request, queryset):
        return self._bulk(request, queryset, "resume")

    @admin.action(description="Retry selected failed executions (a new attempt, handed to a worker)",
                  permissions=["retry"])
    def retry_executions(self, request, queryset):
        return self._bulk(request, queryset, "retry")

    @admin.action(description="Cancel selected executions (recorded as EXECUTION_CANCELLED)", permissions=["cancel"])
    def cancel_executions(self, request, queryset):
        return self._bulk(request, queryset, "cancel")

    @admin.action(description="Wake selected waiting executions now", permissions=["wake"])
    def wake_executions(self, request, queryset):
        return self._bulk(request, queryset, "wake")

    @admin.action(description="Suspend selected executions (no worker until resumed)", permissions=["suspend"])
    def suspend_executions(self, request, queryset):
        return self._bulk(request, queryset, "suspend")

    def _bulk(self, request, queryset, verb: str):
        # The selection on every shard (journal/admin_shards.py); each act() runs on its execution's shard.
        selected = ShardedRows(self.selection(request, queryset))
        executions = list(selected[:BULK_LIMIT])
        left = max(0, selected.count() - len(executions))
        rows = [(execution, *plan(execution, verb)) for execution in executions]
        if request.POST.get("post") == "yes":
            done = sum(act(request, execution.pk, verb) for execution, will, _ in rows if will)
            skipped = [execution.pk for execution, will, _ in rows if not will]
            if skipped:
                messages.warning(request, f"{verb}: nothing done for {', '.join(skipped)}")
            if left:
                messages.warning(request, f"{verb}: {left} more selected execution(s) were not touched (at most "
                                          f"{BULK_LIMIT} per action): run it again for them")
            if not done and not skipped:
                messages.info(request, f"{verb}: nothing selected")
            return None
        context = {
            **self.admin_site.each_context(request), "opts": self.model._meta,
            "title": f"{verb.capitalize()} executions?", "verb": verb, "rows": rows,
            "any_will": any(will for _, will, _ in rows), "picked": [pick_value(e) for e, _, _ in rows],
            "left": left, "limit": BULK_LIMIT,
            "action_checkbox_name": ACTION_CHECKBOX_NAME, "action": f"{verb}_executions",
            **_crumbs(None, f"{verb.capitalize()} executions"),
        }
        return TemplateResponse(request, "journal/execution_action_confirm.html", context)

    # -- one execution: the buttons of its page ------------------------------------------------------
    def get_urls(self):
        urls = super().get_urls()
        extra = [
            path(f"<path:object_id>/{verb}/", self.admin_site.admin_view(self._one(verb)),
                 name=f"journal_execution_{verb}")
            for verb in VERBS
        ]
        extra.append(path("flow-versions/", self.admin_site.admin_view(self.flow_versions_view),
                          name="journal_execution_flow_versions"))
        return extra + urls

    def flow_versions_view(self, request):
        """Per flow, its versions: registered in this (web) process or not, and the executions of each still
        live (not settled), every shard counted: a version with none may leave the code (docs/flows.md)."""
        from journal.flows.versions import live_versions

        if not self.has_view_permission(request):
            raise PermissionDenied
        unread: dict[str, str] = {}
        versions = []
        for alias in shards.shards():  # one shard at a time: a shard that does not answer is named, not a 500
            try:
                versions.append(live_versions([alias]))
            except UNREACHABLE as error:
                unread[alias] = ShardUnreachable(alias, error).reason
        merged: dict[tuple[str, int], Any] = {}
        for found in versions:
            for v in found:
                seen = merged.get((v.flow, v.version))
                live = v.live if seen is None else {k: seen.live.get(k, 0) + v.live.get(k, 0)
                                                    for k in sorted({*seen.live, *v.live})}
                merged[(v.flow, v.version)] = replace(v, live=live)
        for alias, reason in unread.items():  # its live executions are unknown: no version is called safe to retire
            messages.error(request, f"Shard “{alias}” could not be read ({reason}): its live executions are not "
                                    "counted, so no version is said to be safe to retire.")
        context = {**self.admin_site.each_context(request), "opts": self.model._meta, "title": "Flow versions",
                   "versions": [merged[key] for key in sorted(merged)], "unread": sorted(unread),
                   **_crumbs(None, "Flow versions")}
        return TemplateResponse(request, "journal/flow_versions.html", context)



    def _one(self, verb: str):
        def sharded_view(request, object_id):
            if stored_id_problem(unquote(object_id)) is not None:  # NUL, lone surrogate: no such execution
                raise Http404("no such execution")
            return self.row_page(request, object_id, lambda: view(request, object_id))  # on its shard

        def view(request, object_id):
            execution = get_object_or_404(Execution, pk=unquote(object_id))
            url = reverse("admin:journal_execution_change", args=[quote(execution.pk)])
            if not self.has_view_permission(request, execution) or not self.may(request, verb):
                messages.error(request, f"you may not {verb} executions")
                return HttpResponseRedirect(url)
            force = request.POST.get("force") == "yes" or request.GET.get("force") == "yes"
            confirmed = request.POST.get("confirm") == "yes"
            needs_confirmation = verb in CONFIRMED or force
            fields, problem = ({}, None)
            if verb in FORMS and request.method == "POST":
                fields, problem = form_fields(verb, request.POST)
            if request.method == "POST" and (confirmed or not needs_confirmation) and problem is None:
                act(request, execution.pk, verb, force=force, fields=fields)
                return HttpResponseRedirect(url)
            will, what = plan(execution, verb, force=force)
            context = {
                **self.admin_site.each_context(request), "opts": self.model._meta, "original": execution,
                "title": f"{verb.capitalize()} {execution.pk}?", "verb": verb, "force": force, "will": will,
                "what": what, "change_url": url, **_crumbs(execution, verb.capitalize()),
                "problem": problem, "form": request.POST if request.method == "POST" else {},
            }
            return TemplateResponse(request, "journal/execution_confirm.html", context)

        return sharded_view

    def get_object(self, request, object_id, from_field=None):
        """None (the admin's "does not exist") for an id the database cannot hold (NUL, lone surrogate)."""
        if stored_id_problem(object_id) is not None:
            return None
        return super().get_object(request, object_id, from_field)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        # its header, log and panels on the execution's shard (a 503 naming it when it cannot be read)
        return self.row_page(request, object_id, lambda: self._change_view(request, object_id, form_url, extra_context))

    def _change_view(self, request, object_id, form_url="", extra_context=None):
        from journal.exceptions import InvalidStream
        from journal.flows import describe, ownership  # (the function; journal.flows loads it lazily)
        from journal.flows.errors import UnknownExecution

        execution_id = unquote(object_id)
        extra_context = dict(extra_context or {})
        try:
            view = describe(execution_id, reader_for_user(request.user))
        except (UnknownExecution, InvalidStream):  # an id the database cannot hold is no execution either
            view = None
        if view is not None:
            if view.get("header_status") in ("waiting", "suspended"):
                # Parked or suspended is the header's word (the wait row's); the log's fold says running.
                view["status"] = view["header_status"]
            retried_at = None
            for event in view["events"]:
                payload = event["payload"]
                if isinstance(payload, dict) and isinstance(payload.get("traceback"), str):
                    # Shown as the lines it is, under the payload, not as one escaped JSON string (issue #28).
                    event["traceback"] = payload["traceback"]
                    payload = {k: v for k, v in payload.items() if k != "traceback"}
                event["json"] = json.dumps(payload, sort_keys=True, ensure_ascii=False)
                event["when"] = stamp(event["recorded_at"])
                if event["type"] == "EXECUTION_RETRIED":
                    retried_at = event["recorded_at"]
            for row in view["steps"]:
                row["json"] = json.dumps(row["result"], sort_keys=True, ensure_ascii=False)
                row["when"] = stamp(row["started_at"])
            running = view["status"] == "running"
            began = retried_at or view["created_at"]  # this attempt's start: a retry's, else the creation
            view["running_for"] = (f"{(timezone.now() - began).total_seconds():.3f} s"
                                   + (" (since its retry)" if retried_at else "") if running and began else "")
            view["holder"] = ownership.live_owner(execution_id) if running else None
            view["parent_link"] = tree_row(view["parent"]) if view.get("parent") else None
            view["child_links"] = [tree_row(child) for child in view.get("children", [])[:TREE_LIMIT]]
            view["children_left"] = max(0, len(view.get("children", [])) - TREE_LIMIT)
            view["refusals"] = {}  # buttons shown disabled, with the reason the verb would be refused
            if running and view["holder"]:
                will, why = plan(execution_header(execution_id), "resume")
                if not will:
                    view["refusals"]["resume"] = why
            view["waiting"] = waiting_for(execution_id) if view["status"] == "waiting" else None
            view["messages"] = pending(execution_id) if view["status"] in UNSETTLED else []
        extra_context["execution_view"] = view
        extra_context["may"] = {verb: self.may(request, verb) for verb in VERBS}
        extra_context["refresh"] = (view is not None and view["status"] in ("running", "waiting")
                                    and IS_POPUP_VAR not in request.GET)
        return super().change_view(request, object_id, form_url, extra_context)


@admin.register(Event)
class EventAdmin(SafeChangeList, ReadOnlyAdmin):
    list_display = ("stream_id", "seq", "type", "recorded")
    list_filter = ("type",)
    search_fields = ("stream_id",)
    withheld_lookups = ("payload",)
    readonly_fields = ("id", "stream_id", "seq", "type", "payload_json", "recorded")
    fields = readonly_fields
    show_full_result_count = False

    @admin.display(description="recorded", ordering="recorded_at")
    def recorded(self, event) -> str:
        return stamp(event.recorded_at)

    def get_object(self, request, object_id, from_field=None):
        event = super().get_object(request, object_id, from_field)
        if event is not None:  # sensitive fields as this user may see them (docs/privacy.md)
            event.reader = reader_for_user(request.user)
        return event

    @admin.display(description="payload")
    def payload_json(self, event) -> str:
        from journal.envelopes import StoredEvent
        from journal.store import store_for

        stored = StoredEvent(event.stream_id, event.seq, event.type, event.payload, event.recorded_at, event.id)
        reader = getattr(event, "reader", Reader("", frozenset()))  # no reader known: withhold everything
        shown = store_for(event._state.db or "default").reveal([stored], reader)[0]
        return format_html("<pre>{}</pre>", _json(shown.payload))


@admin.register(DataKey)
class DataKeyAdmin(SafeChangeList, ReadOnlyAdmin):
    """Data subjects (docs/privacy.md): whose key is held, who forgot whom. The wrapped key is never shown."""

    list_display = ("subject", "state", "master_id", "created_at", "forgotten_at", "forgotten_by")
    search_fields = ("subject",)
    withheld_lookups = ("wrapped",)  # the wrapped key: never shown, never filtered on (a prefix oracle)
    fields = readonly_fields = ("subject", "state", "master_id", "created_at", "forgotten_at", "forgotten_by")
    actions = ["forget_subjects"]
    show_full_result_count = False

    @admin.display(description="key")
    def state(self, subject) -> str:
        return "forgotten" if subject.wrapped is None else "held"

    def has_forget_permission(self, request) -> bool:
        return request.user.has_perm("journal.forget_subject")

    @admin.action(description="Forget selected subjects (destroy their keys)", permissions=["forget"])
    def forget_subjects(self, request, queryset):
        from journal.privacy import forget

        # The selection on every shard; a subject's keys on several shards are listed (and forgotten) once.
        selected = ShardedRows(self.selection(request, queryset), skip_unreachable=True)
        subjects = list({s.pk: s for s in selected[:BULK_LIMIT]}.values())
        left = max(0, selected.count() - BULK_LIMIT)  # rows past the limit (a subject may have one per shard)
        if selected.unreachable:  # a selection read in part is not what was ticked: refuse it whole, and say why
            messages.error(request, (
                f"Forget: the selection could not be read on shard(s) {', '.join(selected.unreachable)} "
                f"({'; '.join(f'{a}: {r}' for a, r in selected.unreachable.items())}): nothing was forgotten. "
                "Run the action again once the shard is back."))
            return None
        if request.POST.get("post") == "yes":
            by = f"admin:{request.user.get_username()}"
            done, incomplete = [], []
            for subject in subjects:
                # With shards a subject's keys are on every shard its data is on: forget on all of them. A shard
                # that does not answer stops neither the others nor the next subject; the operator is told.
                try:
                    forget(subject.pk, by=by, alias=None if shards.sharded() else queryset.db)
                except ForgetIncomplete as exc:
                    incomplete.append(exc)
                else:
                    done.append(subject.pk)
            if done:
                messages.success(request, f"forgotten: {', '.join(done)}")
            for exc in incomplete:
                messages.error(request, (
                    f"Subject {exc.subject} is NOT forgotten on shard(s) {', '.join(exc.failed)} "
                    f"({'; '.join(f'{a}: {r}' for a, r in exc.failed.items())}): its key there is still held and "
                    f"its data there still readable. Done on: {', '.join(exc.forgotten) or 'no shard'}. Run this "
                    "action again once the shard is back."))
            if left:
                messages.warning(request, f"forget: {left} more selected key row(s) were not touched (at most "
                                          f"{BULK_LIMIT} per action): run it again for them")
            return None
        context = {
            **self.admin_site.each_context(request), "opts": self.model._meta, "subjects": subjects,
            "title": "Forget these data subjects?", "action_checkbox_name": ACTION_CHECKBOX_NAME,
            "left": left, "limit": BULK_LIMIT,
            "picked": [pick_value(s) for s in subjects],
        }
        return TemplateResponse(request, "journal/datakey_forget_confirm.html", context)


@admin.register(Fence)
class FenceAdmin(SafeChangeList, ReadOnlyAdmin):
    list_display = ("stream_id", "token", "created_at")
    search_fields = ("stream_id",)
    readonly_fields = ("stream_id", "token", "created_at")


@admin.register(Snapshot)
class SnapshotAdmin(SafeChangeList, ReadOnlyAdmin):
    list_display = ("stream_id", "seq", "created_at")
    search_fields = ("stream_id",)
    withheld_lookups = ("state",)
    readonly_fields = ("stream_id", "seq", "state", "created_at")


@admin.register(Removal)
class RemovalAdmin(SafeChangeList, ReadOnlyAdmin):
    """The retention service's batches (journal/retention.py), newest first; the list says what is due now."""

    list_display = ("id", "removed_at", "executions", "events", "messages", "flow_events", "archive")
    readonly_fields = ("removed_at", "executions", "events", "messages", "flow_events", "ids", "archive")
    withheld_lookups = ("ids",)  # no ?ids__contains=<id> oracle of which executions were removed (SafeChangeList)

    def changelist_view(self, request, extra_context=None):
        from journal import retention

        aliases = shards.shards() if shards.sharded() else [self.model.objects.db]
        policies = retention.status(aliases[0], recent=0)["due"]
        for alias in aliases[1:]:  # what is due on every shard, added up per policy
            for mine, theirs in zip(policies, retention.status(alias, recent=0)["due"], strict=True):
                mine["due"] += theirs["due"]
        if not policies:
            self.message_user(request, "No retention configured (LOOM_RETENTION_DAYS, LOOM_RETENTION_FLOWS): "
                                       "nothing is removed.", messages.INFO)
        for due in policies:
            self.message_user(request, f"{due['policy']}: {due['days']:g} day(s), {due['due']} execution(s) due "
                                       f"(finished before {due['cutoff']}).", messages.INFO)
        return super().changelist_view(request, extra_context)


@admin.register(Compaction)
class CompactionAdmin(SafeChangeList, ReadOnlyAdmin):
    """Aggregate streams' compaction batches (journal/compaction.py), newest first; the list names the compacted
    states."""

    list_display = ("id", "compacted_at", "state", "stream_id", "before_seq", "events", "snapshots")
    readonly_fields = ("compacted_at", "state", "stream_id", "before_seq", "events", "snapshots")
    list_filter = ("state",)

    def changelist_view(self, request, extra_context=None):
        from journal import compaction, conf  # app registry: compaction reads the declared states at use

        try:
            chosen = [st.name for st in compaction.compacted_states()]
        except conf.ConfigError as exc:
            self.message_user(request, f"Compaction is misconfigured: {exc}", messages.ERROR)
            chosen = None
        if chosen == []:
            self.message_user(request, "No aggregate state is compacted (State(compact=True), "
                                       "LOOM_COMPACT_AGGREGATES).", messages.INFO)
        elif chosen:
            self.message_user(request, f"Compacted states: {', '.join(chosen)} (the events before each stream's "
                                       "newest snapshot are deleted).", messages.INFO)
        return super().changelist_view(request, extra_context)


def execution_url(execution_id: str) -> str:
    """The admin page of an execution (ids quoted the admin's way)."""
    return reverse("admin:journal_execution_change", args=[quote(execution_id)])


admin.site.register(AggregateStream, AggregateAdmin)  # the aggregates' pages, listed on the admin index


def form_fields(verb: str, data) -> tuple[dict, str | None]:
    """The checked fields of a form verb's page, or the problem to show on the form again (nothing is
    done then). The runtime checks them once more (journal.flows.send / fork refuse with our errors)."""
    if verb == "message":
        topic = (data.get("topic") or "").strip()
        if not topic:
            return {}, "a topic is required"
        try:
            payload = json.loads(data.get("payload") or "", parse_constant=_no_constant)
        except ValueError as exc:
            return {}, f"the payload is not JSON: {exc}"
        return {"topic": topic, "payload": payload, "message_id": (data.get("message_id") or "").strip() or None}, None
    text = (data.get("from_step") or "").strip()
    if not text.isdigit():
        return {}, f"from step must be a step position (0, 1, 2...), got {text[:40]!r}"
    return {"from_step": int(text), "new_id": (data.get("new_id") or "").strip() or None}, None


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


TREE_LIMIT = 100  # children linked on a parent's page; the rest are counted


def tree_row(execution_id: str) -> dict:
    """A parent or child of an execution: its id, its page and its status (on its own shard)."""
    from journal.flows.writer import header_status

    try:
        header = header_status(execution_id)
    except Exception:  # an id the database cannot hold, or its shard not answering: named, not a 500
        header = None
    return {"id": execution_id, "url": execution_url(execution_id), "status": header[0] if header else "not begun"}


def execution_header(execution_id: str) -> Execution:
    """The header row plan() reads (on the execution's shard)."""
    return Execution.objects.using(shards.shard_for(execution_id)).get(pk=execution_id)


def waiting_for(execution_id: str) -> dict | None:
    """What a waiting execution waits for, with its due time in the admin's one format."""
    from journal.flows import waiting_on

    found = waiting_on(execution_id)
    if found is None:
        return None
    found = dict(found)
    found["due"] = stamp(found.get("due_at")) if found.get("due_at") else ""
    if found.get("child"):
        found["child_url"] = execution_url(found["child"])
    return found


def pending(execution_id: str) -> list[dict]:
    """The messages kept for an execution that no recv consumed yet (newest 50)."""
    from journal.flows import pending_messages

    rows = []
    for row in pending_messages(execution_id):
        row = dict(row)
        row["json"] = json.dumps(row.get("payload"), sort_keys=True, ensure_ascii=False)
        row["when"] = stamp(row.get("sent_at"))
        rows.append(row)
    return rows


def _crumbs(execution: Execution | None, last: str) -> dict:
    """Breadcrumbs of the confirmation pages: Home > Loom journal > Executions > [id] > last."""
    opts = Execution._meta
    crumbs = [(opts.app_config.verbose_name, reverse("admin:app_list", args=["journal"])),
              ("Executions", reverse("admin:journal_execution_changelist"))]
    if execution is not None:
        crumbs.append((execution.pk, execution_url(execution.pk)))
    crumbs.append((last, None))
    return {"crumbs": crumbs, "ol_breadcrumbs": django.VERSION >= (6, 0)}
