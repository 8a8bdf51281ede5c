"""Subscriptions in the admin: lag (tip - watermark), blocked ones with their error, unblock, reset.

Each action declares the permission it needs (custom permissions of Subscription: `unblock_subscription`,
`replay_subscription`), so view-only staff can look but not act. Reset wipes read models: it shows a
confirmation page saying what will happen before anything changes. Both pages are read-only for
everyone (journal/admin_base.py): rows cannot be added, changed or deleted here, since a deleted
subscription would come back at watermark -1 and replay its stream into a read model that already
holds it, and a checkpoint is the correlation scan's own bookkeeping.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import Count, F
from django.template.response import TemplateResponse

from journal import shards
from journal.admin_base import ReadOnlyAdmin
from journal.admin_shards import pick_value
from journal.atomic import atomic
from projections.declarations import registry
from projections.models import Checkpoint, Subscription
from projections.store import store_for


class BlockedFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return [("blocked", "blocked"), ("lagging", "lagging"), ("caught-up", "caught up")]

    def queryset(self, request, queryset):
        if self.value() == "blocked":
            return queryset.filter(blocked=True)
        if self.value() == "lagging":
            return queryset.filter(blocked=False, tip__gt=F("at"))
        if self.value() == "caught-up":
            return queryset.filter(tip__lte=F("at"))
        return queryset


def reset_consumers(names: set[str], alias: str | None = None) -> int:
    """Replay consumers from the start: their reset hook (wipe the read model) and watermarks to -1,
    in one transaction, so a replay never mixes old rows with new (on one shard: with several, each
    shard's watermarks are reset in its own transaction, docs/scaling.md)."""
    if alias is None and shards.sharded():
        return sum(reset_consumers(names, each) for each in shards.shards())
    alias = alias or shards.home()
    count = 0
    with atomic(alias):
        for name in sorted(names):
            consumer = registry.consumers.get(name)
            if consumer is not None and consumer.reset is not None:
                consumer.reset()
            count += store_for(alias).reset(name)
    return count


@admin.register(Subscription)
class SubscriptionAdmin(ReadOnlyAdmin):
    list_display = ("consumer", "stream", "lane", "priority", "at", "tip", "lag", "blocked", "retries",
                    "leased_by", "leased_until", "short_error")
    list_filter = (BlockedFilter, "lane", "consumer")
    search_fields = ("consumer", "stream", "error")
    readonly_fields = [f.name for f in Subscription._meta.fields]
    actions = ("unblock", "reset_replay")

    def has_unblock_permission(self, request) -> bool:
        return request.user.has_perm("projections.unblock_subscription")

    def has_replay_permission(self, request) -> bool:
        return request.user.has_perm("projections.replay_subscription")

    @admin.display(description="lag")
    def lag(self, obj: Subscription) -> int:
        return obj.lag

    @admin.display(description="error")
    def short_error(self, obj: Subscription) -> str:
        return obj.error.splitlines()[0][:120] if obj.error else ""

    @admin.action(description="Unblock (retry from the failed event)", permissions=["unblock"])
    def unblock(self, request, queryset):
        # Each shard's ticked rows on that shard (ids repeat across shards: journal/admin_shards.py).
        count = sum(store_for(part.db).unblock(list(part.values_list("id", flat=True)))
                    for part in self.selection(request, queryset))
        self.message_user(request, f"{count} subscription(s) unblocked.", messages.SUCCESS)

    @admin.action(description="Reset: replay the selected consumers from the start", permissions=["replay"])
    def reset_replay(self, request, queryset):
        parts = self.selection(request, queryset)
        names = {name for part in parts for name in part.values_list("consumer", flat=True)}
        if request.POST.get("post") != "yes":
            return self._confirm_reset(request, parts, names)
        # A consumer is replayed on every shard: its reset hook wipes a read model fed by all of them, so a
        # replay on the ticked row's shard alone would rebuild it without the other shards' events.
        count = reset_consumers(names, None if shards.sharded() else queryset.db)
        self.message_user(request, f"{', '.join(sorted(names))}: {count} subscription(s) reset for replay.",
                          messages.SUCCESS)

    def _confirm_reset(self, request, parts, names: set[str]) -> TemplateResponse:
        """What a reset will do, per consumer, before it is done (nothing changes on this page)."""
        aliases = shards.shards() if shards.sharded() else [parts[0].db]
        totals: dict[str, int] = {}
        for alias in aliases:  # every subscription of the consumer, on every shard (what reset_consumers resets)
            for name, n in (Subscription.objects.using(alias).filter(consumer__in=names).values("consumer")
                            .annotate(n=Count("id")).values_list("consumer", "n")):
                totals[name] = totals.get(name, 0) + n
        consumers = []
        for name in sorted(names):
            declared = registry.consumers.get(name)
            consumers.append({"name": name, "subscriptions": totals.get(name, 0), "declared": declared is not None,
                              "kind": declared.kind if declared else "not declared here",
                              "wipes": declared is not None and declared.reset is not None})
        context = {**self.admin_site.each_context(request), "title": "Reset and replay: are you sure?",
                   "opts": self.model._meta, "consumers": consumers,
                   "selected": [pick_value(row) for part in parts for row in part],
                   "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME}
        return TemplateResponse(request, "projections/reset_replay_confirmation.html", context)


@admin.register(Checkpoint)
class CheckpointAdmin(ReadOnlyAdmin):
    list_display = ("consumer", "position", "horizon_id", "horizon_at", "horizon_xmax", "updated_at")
    readonly_fields = ("consumer", "position", "horizon_id", "horizon_at", "horizon_xmax", "updated_at")
