"""Admin: the queues, read-only, with what an operator asks first: how many run (against the cap),
how many wait (depth), the per-partition cap and the rate limit. Caps are declared in settings or
code (LOOM_QUEUES, declare_queue) and written to the rows by the workers, so nothing here edits them.
The figures come from the queues store (`queues.stats`: one statement for every queue), taken once
per page. Each queue links to its executions (the executions list filtered by queue)."""

from __future__ import annotations

from contextvars import ContextVar

from django.contrib import admin, messages
from django.urls import reverse
from django.utils.html import format_html

from journal.admin_base import ReadOnlyAdmin
from queues.models import Queue

_stats: ContextVar[dict | None] = ContextVar("loom_queue_stats", default=None)


def _figures(queue: Queue):
    """The queue's stats row: taken once for the page being rendered (this request's context), else now."""
    import queues

    found = _stats.get()
    if found is None or queue.pk not in found:  # every shard's figures added up, as on the list
        found = {row.name: row for row in queues.stats(unreachable={})}  # an unreachable shard's left out
    return found.get(queue.pk)


@admin.register(Queue)
class QueueAdmin(ReadOnlyAdmin):
    list_display = ("name", "running", "cap", "depth", "ready", "partition_cap", "rate", "executions")
    fields = ("name", "running", "cap", "depth", "ready", "partition_cap", "rate", "updated_at", "executions")
    readonly_fields = fields
    search_fields = ("name",)
    # One row per queue, not per shard: a queue's row is on every shard (each counts its own caps), so one
    # database's rows name them all; the figures are every shard's added up (queues.stats), list and page.
    rows_per_shard = False

    def changelist_view(self, request, extra_context=None):
        import queues

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
        return format_html('<a href="{}?queue={}">executions of {}</a>', url, queue.name, queue.name)
