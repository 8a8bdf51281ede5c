"""Subscriptions in the admin: lag (tip - watermark), blocked ones with their error, unblock, reset."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db import transaction
from django.db.models import F

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


def reset_consumers(names: set[str], alias: str = "default") -> int:
    """Replay consumers from the start: their reset hook (wipe the read model) and watermarks to -1,
    in one transaction, so a replay never mixes old rows with new."""
    count = 0
    with transaction.atomic(using=alias):
        for name in sorted(names):
            consumer = registry.consumers.get(name)
            if consumer is not None and consumer.reset is not None:
                consumer.reset()
            count += store_for(alias).reset(name)
    return count


@admin.register(Subscription)
class SubscriptionAdmin(admin.ModelAdmin):
    list_display = ("consumer", "stream", "lane", "priority", "at", "tip", "lag", "blocked", "retries",
                    "leased_by", "leased_until", "short_error")
    list_filter = (BlockedFilter, "lane", "consumer")
    search_fields = ("consumer", "stream", "error")
    readonly_fields = [f.name for f in Subscription._meta.fields]
    actions = ("unblock", "reset_replay")

    def has_add_permission(self, request):
        return False

    @admin.display(description="lag")
    def lag(self, obj: Subscription) -> int:
        return obj.lag

    @admin.display(description="error")
    def short_error(self, obj: Subscription) -> str:
        return obj.error.splitlines()[0][:120] if obj.error else ""

    @admin.action(description="Unblock (retry from the failed event)")
    def unblock(self, request, queryset):
        count = store_for(queryset.db).unblock(list(queryset.values_list("id", flat=True)))
        self.message_user(request, f"{count} subscription(s) unblocked.", messages.SUCCESS)

    @admin.action(description="Reset: replay the selected consumers from the start")
    def reset_replay(self, request, queryset):
        names = set(queryset.values_list("consumer", flat=True))
        count = reset_consumers(names, queryset.db)
        self.message_user(request, f"{', '.join(sorted(names))}: {count} subscription(s) reset for replay.",
                          messages.SUCCESS)


@admin.register(Checkpoint)
class CheckpointAdmin(admin.ModelAdmin):
    list_display = ("consumer", "position", "horizon_id", "horizon_at", "updated_at")
    readonly_fields = ("consumer", "position", "horizon_id", "horizon_at", "updated_at")

    def has_add_permission(self, request):
        return False
