"""The admin over shards (journal/shards.py): one mechanism for every page of a model whose rows live on
every shard (the journal's, leases', projections' and queues' models, ShardRouter.routes).

- The list merges every shard's rows (count, pages, ordering) and shows each row's shard in a "shard" column.
- A row's link carries its shard (`?shard=<alias>`): ids are not unique across shards (a subscription's or
  an event's integer id, a checkpoint's consumer, a worker id registered on each shard), so the change page
  reads the shard it is told. Without the parameter (a link built elsewhere: an inline's, the history's) it
  reads the shard `find_shard` names: the first that holds the id (executions: the id's placement).
- An action's checkbox names the row's shard (`<alias>:<pk>`); the action is given the selection on the first
  shard picked, and `selection()` gives it the selection on each shard, so it acts on the rows that were
  ticked, on their own databases, never on a row of another shard that shares an id.

With one shard nothing changes: Django's list, links, checkboxes and selection, and no binding.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from functools import cmp_to_key
from urllib.parse import urlencode

from django.contrib import admin
from django.contrib.admin import helpers
from django.contrib.admin.utils import unquote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import ValidationError
from django.db.models import QuerySet

from journal import shards
from journal.ids import stored_id_problem

SHARD_PARAM = "shard"  # the query parameter of a change page naming the row's shard


def spans_shards(model_admin) -> bool:
    """The admin's rows live on several shards: LOOM_SHARDS names more than one, the model is routed to them,
    and the admin lists one row per shard (QueueAdmin lists a queue once, its figures added up)."""
    return (shards.sharded() and shards.ShardRouter.routes(model_admin.model)
            and getattr(model_admin, "rows_per_shard", True))


class ShardedRows:
    """The rows of one query on several shards, merged in the query's order: what the admin's paginator counts
    and slices, and what a bulk action lists. A page [a:b] reads at most b rows per shard; each row remembers
    its shard (`row._state.db`)."""

    ordered = True  # the paginator's check: the order is the queryset's, applied per shard and in the merge

    def __init__(self, parts: list[QuerySet]):
        self.parts = parts
        first = parts[0] if parts else None
        order = (list(first.query.order_by) or list(first.model._meta.ordering) or ["-pk"]) if first is not None else []
        self.keys = [(name.lstrip("-"), name.startswith("-")) for name in order if isinstance(name, str)]
        self._count: int | None = None

    @classmethod
    def over(cls, queryset: QuerySet, aliases: list[str]) -> ShardedRows:
        """The same query on each alias."""
        return cls([queryset.using(alias) for alias in aliases])

    def count(self) -> int:
        if self._count is None:
            self._count = sum(part.count() for part in self.parts)
        return self._count

    def __len__(self) -> int:
        return self.count()

    def _compare(self, a, b) -> int:
        for name, descending in self.keys:
            x, y = getattr(a, "pk" if name == "pk" else name, None), getattr(b, "pk" if name == "pk" else name, None)
            if x == y:
                continue
            less = y is None if x is None or y is None else x < y  # NULLs last, as PostgreSQL sorts ascending
            return (1 if less else -1) if descending else (-1 if less else 1)
        return 0

    def __getitem__(self, key):
        if isinstance(key, int):
            return self[key:key + 1][0]
        stop = key.stop if key.stop is not None else self.count()
        rows = [row for part in self.parts for row in part[:stop]]
        rows.sort(key=cmp_to_key(self._compare))
        return rows[key]


class ShardedChangeList(ChangeList):
    """A list page over every shard: the count, the page and the "show all" list are merged from each shard's
    query (filters, search and ordering apply on each); each row's link names its shard. One shard, or a model
    that stays on one database: Django's own list, unchanged."""

    def get_results(self, request) -> None:
        super().get_results(request)
        if not spans_shards(self.model_admin):
            return
        rows = ShardedRows.over(self.queryset, shards.shards())
        self.result_count = self.full_result_count = rows.count()
        self.can_show_all = self.result_count <= self.list_max_show_all
        self.multi_page = self.result_count > self.list_per_page
        if (self.show_all and self.can_show_all) or not self.multi_page:
            self.result_list = rows[0:self.result_count]
        else:
            self.paginator = self.model_admin.get_paginator(request, rows, self.list_per_page)
            self.result_list = self.paginator.get_page(self.page_num).object_list

    def url_for_result(self, result) -> str:
        url = super().url_for_result(result)
        if spans_shards(self.model_admin) and result._state.db:
            url += "?" + urlencode({SHARD_PARAM: result._state.db})
        return url


def pick_value(obj) -> str:
    """The value of a row's action checkbox: `<alias>:<pk>` (its shard named) when sharded, else the pk."""
    return f"{obj._state.db}:{obj.pk}" if shards.sharded() and obj._state.db else str(obj.pk)


def split_picks(values: list[str]) -> dict[str, list[str]]:
    """Checkbox values by shard, shards in placement order. A value that names no shard (a page rendered
    before sharding) is looked for on every shard."""
    aliases = shards.shards()
    found: dict[str, list[str]] = {}
    for value in values:
        alias, sep, pk = value.partition(":")
        for each in ([alias] if sep and alias in aliases else aliases):
            found.setdefault(each, []).append(pk if sep and alias in aliases else value)
    return {alias: found[alias] for alias in aliases if alias in found}


class ShardedAdmin:
    """The shard-aware parts of a ModelAdmin (ReadOnlyAdmin includes it): list, column, links, change page,
    history page and actions. An admin whose rows are one per shard needs nothing more; an action that acts on
    its selection iterates `self.selection(request, queryset)`. `find_shard` may be overridden where an id
    names its shard (executions: the stream's placement)."""

    rows_per_shard = True  # False: list one database's rows (each row stands for every shard's: queues)

    def get_changelist(self, request, **kwargs):
        return ShardedChangeList

    def get_list_display(self, request):
        shown = tuple(super().get_list_display(request))
        if spans_shards(self):
            return shown if "shard" in shown else (*shown, "shard")
        return tuple(name for name in shown if name != "shard")

    @admin.display(description="shard")
    def shard(self, obj) -> str:
        return obj._state.db or ""

    def action_checkbox(self, obj):
        if not spans_shards(self):
            return super().action_checkbox(obj)
        from django import forms

        attrs = {"class": "action-select", "aria-label": f"Select this object for an action - {obj}"}
        return forms.CheckboxInput(attrs, lambda value: False).render(helpers.ACTION_CHECKBOX_NAME, pick_value(obj))

    # -- one row: its change and history pages read its shard -------------------------------------------
    def find_shard(self, object_id: str) -> str | None:
        """The shard of a row asked for without `?shard=`: the first shard that holds the id, or None."""
        if stored_id_problem(object_id) is not None:
            return None
        for alias in shards.shards():
            try:
                if self.model._base_manager.using(alias).filter(pk=object_id).exists():
                    return alias
            except (ValueError, TypeError, ValidationError):  # not an id of this model at all
                return None
        return None

    def shard_of(self, request, object_id: str) -> str | None:
        """The shard a change page (or an execution's action view) reads: `?shard=` when it names one, else
        `find_shard`; None with one shard (no binding)."""
        if not spans_shards(self):
            return None
        asked = request.GET.get(SHARD_PARAM)
        if asked in shards.shards():
            return asked
        return self.find_shard(unquote(object_id))

    @contextmanager
    def on_row_shard(self, request, object_id: str) -> Iterator[str | None]:
        """Everything inside reads and writes the row's shard (ShardRouter follows the binding)."""
        alias = self.shard_of(request, object_id)
        with shards.bound(alias) if alias else nullcontext():
            yield alias

    def change_view(self, request, object_id, form_url="", extra_context=None):
        with self.on_row_shard(request, object_id):
            return _rendered(super().change_view(request, object_id, form_url, extra_context))

    def history_view(self, request, object_id, extra_context=None):
        with self.on_row_shard(request, object_id):
            return _rendered(super().history_view(request, object_id, extra_context))

    # -- actions: on the rows ticked, each on its shard -----------------------------------------------
    def response_action(self, request, queryset, **kwargs):
        # Django 6.1 also runs actions from a change page (action_location): that one row, on its bound shard.
        if not spans_shards(self) or getattr(kwargs.get("action_location"), "name", "CHANGE_LIST") != "CHANGE_LIST":
            return super().response_action(request, queryset, **kwargs)
        picks = split_picks(request.POST.getlist(helpers.ACTION_CHECKBOX_NAME))
        across = request.POST.get("select_across") in ("1", "True", "true")
        if across:
            parts = [queryset.using(alias) for alias in shards.shards()]
        else:
            parts = [queryset.using(alias).filter(pk__in=pks) for alias, pks in picks.items()]
        first = next(iter(picks), shards.shards()[0])
        # Django filters the action's queryset by the ticked pks on one database: give it the first shard's
        # bare pks and that shard's queryset; the whole selection is request.loom_selection (selection()).
        posted = request.POST
        bare = request.POST.copy()
        bare.setlist(helpers.ACTION_CHECKBOX_NAME, picks.get(first, []))
        request.POST, request.loom_selection = bare, parts
        try:
            return super().response_action(request, queryset.using(first), **kwargs)
        finally:
            request.POST = posted
            del request.loom_selection

    def selection(self, request, queryset) -> list[QuerySet]:
        """The action's selection on each shard it is on (one queryset with one shard)."""
        return getattr(request, "loom_selection", None) or [queryset]


def _rendered(response):
    """A template response rendered while the row's shard is still bound (its fields and inlines read it)."""
    if hasattr(response, "render") and not getattr(response, "is_rendered", True):
        response.render()
    return response
