"""The admin base every Loom app uses for its read-only pages, and the hook by which an app above the
journal adds a panel to the execution page.

Read-only means the same everywhere, for everyone (superusers too): no add, no change, no delete (so
no "delete selected" action either). The log, fences, execution headers, leases, workers and
subscriptions are written by the runtime only; a row deleted by hand would hide a running execution
from recovery, break fence bookkeeping or replay a stream into a read model that holds it. What an
operator may do is an admin action declared with its own permission (`@admin.action(permissions=[...])`
and a `has_<name>_permission` method), so view-only staff can look and not act.

The journal does not import the apps above it: the leases app contributes its lease line to the
execution page with `add_execution_panel()` from its own admin module, so the journal's admin stands
alone when leases is not installed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django.contrib import admin
from django.contrib.admin.views.main import ERROR_FLAG
from django.db import DatabaseError
from django.db.models import DateTimeField
from django.db.models.constants import LOOKUP_SEP
from django.http import HttpResponseRedirect

from journal.admin_shards import ShardedAdmin


class RefuseUnstorableFilters:
    """A list page answers a filter value the database cannot hold as text (NUL, a lone surrogate) like any
    other invalid lookup, with the admin's "?e=1" redirect: PostgreSQL would refuse it with a 500, and a host
    project has no loomsite middleware to catch it first.

    It also refuses any lookup on a column of `withheld_lookups` (400, as Django answers a lookup it does not
    allow): Django lets a list page filter on every local field, so `?wrapped__startswith=` on data keys was
    a prefix oracle on a secret column for view-only staff, and `?payload__contains=` would be one on data a
    viewer is shown redacted. tests/security/test_security_admin.py checks every text and JSON column of every Loom
    admin is either withheld or named harmless there."""

    withheld_lookups: tuple[str, ...] = ()

    def lookup_allowed(self, lookup: str, value, request) -> bool:
        if lookup.split(LOOKUP_SEP, 1)[0] in self.withheld_lookups:
            return False
        return super().lookup_allowed(lookup, value, request)

    def changelist_view(self, request, extra_context=None):
        if any(_unstorable(value) for values in request.GET.lists() for value in values[1]):
            return HttpResponseRedirect(f"{request.path}?{ERROR_FLAG}=1")
        return super().changelist_view(request, extra_context)


class SafeChangeList(RefuseUnstorableFilters):
    """The journal's list pages also answer a value out of range (a year past 9999) with "?e=1", never a 500."""

    def changelist_view(self, request, extra_context=None):
        try:
            return super().changelist_view(request, extra_context)
        except (ValueError, OverflowError, DatabaseError):
            if ERROR_FLAG in request.GET:
                raise
            return HttpResponseRedirect(f"{request.path}?{ERROR_FLAG}=1")


def _unstorable(value: str) -> bool:
    """NUL and lone surrogates cannot be sent to the database as text."""
    if "\x00" in value:
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


class ReadOnlyPermissions:
    """No add, change or delete, for anyone; viewing follows Django's model permissions."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


_STAMPED: dict[tuple[type, str], Callable] = {}


def stamped(model: type, name: str) -> Callable:
    """A column (or read-only field) showing the date-time field `name` in the one format of every page (UTC, to
    the millisecond: journal/timestamps.py), sortable by it; the same object on every call (the admin matches
    read-only fields by identity), named like the field (its CSS class stays `field-<name>`)."""
    key = (model, name)
    if key not in _STAMPED:
        from journal.timestamps import stamp

        field = model._meta.get_field(name)

        def column(obj) -> str:
            return stamp(getattr(obj, name)) or "-"

        column.__name__ = name
        column.short_description = field.verbose_name  # type: ignore[attr-defined]
        column.admin_order_field = name  # type: ignore[attr-defined]
        _STAMPED[key] = column
    return _STAMPED[key]


class StampedTimes:
    """Every date-time column and read-only field of a Loom page in one format, to the millisecond (issue #28:
    lists were to the minute, so a heartbeat could not be read)."""

    def _stamp(self, names):
        times = {f.name for f in self.model._meta.get_fields() if isinstance(f, DateTimeField)}
        return tuple(stamped(self.model, n) if isinstance(n, str) and n in times else n for n in names)

    def get_list_display(self, request):
        return self._stamp(super().get_list_display(request))

    def get_fields(self, request, obj=None):
        return self._stamp(super().get_fields(request, obj))

    def get_readonly_fields(self, request, obj=None):
        return self._stamp(super().get_readonly_fields(request, obj))


class ReadOnlyAdmin(StampedTimes, ReadOnlyPermissions, RefuseUnstorableFilters, ShardedAdmin, admin.ModelAdmin):
    """A read-only model page: views only, unstorable filters redirect, actions need their own permission.
    The journal's pages put SafeChangeList first, so out-of-range values redirect too. A model that lives on
    every shard (journal, leases, queues, projections) is listed, opened and acted on across shards
    (journal/admin_shards.py)."""


class ReadOnlyInline(ReadOnlyPermissions, admin.TabularInline):
    """A read-only table of related rows on a read-only page."""

    extra = 0
    can_delete = False


@dataclass(frozen=True)
class ExecutionPanel:
    """One line an installed app adds to the execution page: its label and how to render it."""

    name: str
    label: str
    field: Callable  # a read-only field of the execution form (the admin accepts callables)


EXECUTION_PANELS: dict[str, ExecutionPanel] = {}
"""Panels of the execution page, by name, in the order the apps' admin modules registered them."""


def add_execution_panel(name: str, label: str, render: Callable[[str], str]) -> None:
    """Show `render(execution_id)` under `label` on every execution page (an app's admin module calls this)."""

    def field(execution) -> str:
        return render(execution.pk)

    field.short_description = label  # type: ignore[attr-defined]
    field.__name__ = f"{name}_panel"
    EXECUTION_PANELS[name] = ExecutionPanel(name, label, field)


EXECUTION_FILTERS: dict[str, tuple[int, type]] = {}
"""List filters other apps add to the executions list, by name: (place, filter class)."""


def add_execution_filter(name: str, list_filter: type, place: int) -> None:
    """Offer `list_filter` on the executions list, after the journal's own filters, ordered by `place`
    (an app's admin module calls this: the queues app its queue filter, leases its schedule filter)."""
    EXECUTION_FILTERS[name] = (place, list_filter)


def execution_filters() -> tuple[type, ...]:
    """The registered list filters in their places."""
    return tuple(one for _, one in sorted(EXECUTION_FILTERS.values(), key=lambda entry: entry[0]))


def panel_fields() -> tuple[Callable, ...]:
    """The registered panels as read-only fields, the same objects on every call (the admin matches them)."""
    return tuple(panel.field for panel in EXECUTION_PANELS.values())
