"""The admin over shards (journal/shards.py): one mechanism for every page of a model whose rows live on
every shard (the journal's, leases', projections' and queues' models, ShardRouter.routes).

- The list merges every shard's rows (count, pages, ordering: ShardedChangeList, ShardedRows) and shows each
  row's shard in a "shard" column; a shard that cannot be read is left out and named in a message.
- A row's link carries its shard (`?shard=<alias>`): ids are not unique across shards (a subscription's or
  an event's integer id, a checkpoint's consumer, a worker id registered on each shard), so the change page
  reads the shard it is told, and its own links (History, a form's redirects) carry it on. Without the
  parameter (a link built elsewhere: an inline's, the history page's breadcrumb) it reads the shard
  `find_shard` names: the first that holds the id (executions: the id's placement). A row's page whose shard
  cannot be read answers 503 naming it.
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

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.utils import unquote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import FieldDoesNotExist, ValidationError
from django.core.paginator import InvalidPage
from django.db import InterfaceError, OperationalError, connections
from django.db.models import F, OrderBy, QuerySet
from django.db.models.functions import Collate
from django.template.response import TemplateResponse

from journal import shards
from journal.ids import stored_id_problem

SHARD_PARAM = "shard"  # the query parameter of a change page naming the row's shard


def spans_shards(model_admin) -> bool:
    """The admin's rows live on several shards: LOOM_SHARDS names more than one, the model is routed to them,
    and the admin lists one row per shard (QueueAdmin lists a queue once, its figures added up)."""
    return (shards.sharded() and shards.ShardRouter.routes(model_admin.model)
            and getattr(model_admin, "rows_per_shard", True))


class ShardUnreachable(Exception):
    """A shard's database could not be read (down, refusing connections, its session lost)."""

    def __init__(self, alias: str, error: BaseException):
        self.alias, self.reason = alias, _first_line(error)
        super().__init__(f"shard {alias!r} could not be read: {self.reason}")


UNREACHABLE = (OperationalError, InterfaceError)  # a connection that fails, not a query that is wrong


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _merge_order(queryset: QuerySet) -> tuple[QuerySet, list[tuple[str, bool]]]:
    """The queryset ordered the way the merge compares its rows, and the merge's keys (attribute, descending).

    The merge sorts the shards' rows with Python's `<`; each shard must return its first rows in that same
    order, or a shard's rows past its LIMIT would belong on the page (F2 of review r1). So: a text column is
    ordered with the byte-wise "C" collation on PostgreSQL (UTF-8 bytes sort as code points, as Python's
    str does; the same on every shard whatever its locale); SQLite's default BINARY collation already does.
    A nullable column puts NULLs last ascending and first descending, on either backend, as the merge does.
    Chosen over merging with a database's own comparison because shards on different servers may have
    different default collations, and that comparison would cost a round trip per merge; the price is that a
    text-ordered page sorts instead of walking an index, bounded by the depth (ShardedAdmin.shard_list_depth)."""
    model = queryset.model
    vendor = connections[queryset.db].vendor
    order = list(queryset.query.order_by) or list(model._meta.ordering) or ["-pk"]
    keys: list[tuple[str, bool]] = []
    exprs: list = []
    for item in order:
        if not isinstance(item, str) or item == "?" or "__" in item:
            exprs.append(item)
            continue
        name, descending = item.lstrip("-"), item.startswith("-")
        try:
            field = model._meta.pk if name == "pk" else model._meta.get_field(name)
        except FieldDoesNotExist:  # an annotation: ordered as asked, compared by its attribute
            exprs.append(item)
            keys.append((name, descending))
            continue
        attname = getattr(field, "attname", name)
        keys.append((attname, descending))
        expr = F(attname)
        if vendor == "postgresql" and field.get_internal_type() in ("CharField", "TextField", "SlugField",
                                                                    "EmailField", "URLField"):
            expr = Collate(expr, "C")
        if field.null:
            exprs.append(OrderBy(expr, descending=descending, nulls_last=not descending or None,
                                 nulls_first=descending or None))
        elif isinstance(expr, Collate):
            exprs.append(OrderBy(expr, descending=descending))
        else:
            exprs.append(item)
    return queryset.order_by(*exprs), keys


class ShardedRows:
    """The rows of one query on several shards, merged in the query's order: what the admin's paginator counts
    and slices, and what a bulk action lists. A page [a:b] reads at most b rows per shard; each row remembers
    its shard (`row._state.db`). With `skip_unreachable` (the list page) a shard that cannot be read is left
    out and named in `unreachable`; else its error is raised (an action never silently skips a shard's rows).
    One part is read as it is: no merge, so no change of order."""

    ordered = True  # the paginator's check: the order is the queryset's, applied per shard and in the merge

    def __init__(self, parts: list[QuerySet], skip_unreachable: bool = False):
        merged = [_merge_order(part) for part in parts] if len(parts) > 1 else [(part, []) for part in parts]
        self.parts = [part for part, _ in merged]
        self.keys = merged[0][1] if merged else []
        self.skip_unreachable = skip_unreachable
        self.unreachable: dict[str, str] = {}  # alias -> the error's first line
        self._count: int | None = None

    @classmethod
    def over(cls, queryset: QuerySet, aliases: list[str], skip_unreachable: bool = False) -> ShardedRows:
        """The same query on each alias."""
        return cls([queryset.using(alias) for alias in aliases], skip_unreachable)

    def _read(self, read) -> list:
        """`read(part)` on each shard still reachable; a shard whose connection fails is dropped and named."""
        found = []
        for part in list(self.parts):
            try:
                found.append(read(part))
            except UNREACHABLE as error:
                if not self.skip_unreachable:
                    raise
                self.unreachable[part.db] = _first_line(error)
                self.parts.remove(part)
        return found

    def count(self) -> int:
        if self._count is None:
            self._count = sum(self._read(lambda part: part.count()))
        return self._count

    def __len__(self) -> int:
        return self.count()

    def _compare(self, a, b) -> int:
        for name, descending in self.keys:
            x, y = _value(a, name), _value(b, name)
            if x == y:
                continue
            less = y is None if x is None or y is None else x < y  # NULLs last ascending (_merge_order)
            return (1 if less else -1) if descending else (-1 if less else 1)
        return 0

    def __getitem__(self, key):
        if isinstance(key, int):
            return self[key:key + 1][0]
        stop = key.stop if key.stop is not None else self.count()
        rows = [row for found in self._read(lambda part: list(part[:stop])) for row in found]
        rows.sort(key=cmp_to_key(self._compare))
        return rows[key]


def _value(row, name: str):
    """A merge key of a row: a model instance's attribute, or a `values()` row's entry (the aggregate streams'
    list merges dicts)."""
    if isinstance(row, dict):
        return row.get(name)
    return getattr(row, "pk" if name == "pk" else name, None)


class ShardedChangeList(ChangeList):
    """A list page over every shard: the count, the page and the "show all" list are merged from each shard's
    query (filters, search and ordering apply on each); each row's link names its shard. One shard, or a model
    that stays on one database: Django's own list, unchanged.

    Django's get_results is not called when the list spans shards: it counts and pages the default shard
    alone (a page past that shard's own last page redirected to "?e=1"). Here every figure is the merged one:
    one COUNT per shard (a second, of the unfiltered list, only when filters or a search narrow it and
    show_full_result_count asks for it), and the action bar follows the merged count. A page reads its end's
    worth of rows from each shard, so the depth is capped (ShardedAdmin.shard_list_depth): a page past it says
    so and lists nothing, rather than load a whole shard into the web process. A shard that cannot be read is
    left out with an error message naming it; the other shards' rows are listed."""

    def get_results(self, request) -> None:
        if not spans_shards(self.model_admin):
            return super().get_results(request)
        rows = ShardedRows.over(self.queryset, shards.shards(), skip_unreachable=True)
        result_count = rows.count()
        show_full = self.model_admin.show_full_result_count
        if not show_full:
            full_result_count = None
        elif self.queryset.query.where == self.root_queryset.query.where:  # nothing narrows it: the same count
            full_result_count = result_count
        else:
            root = ShardedRows.over(self.root_queryset, [part.db for part in rows.parts], skip_unreachable=True)
            full_result_count = root.count()
            rows.unreachable.update(root.unreachable)
        self.result_count, self.full_result_count = result_count, full_result_count
        self.show_full_result_count = show_full
        self.show_admin_actions = not show_full or bool(full_result_count)
        self.can_show_all = result_count <= self.list_max_show_all
        self.multi_page = result_count > self.list_per_page
        self.paginator = self.model_admin.get_paginator(request, rows, self.list_per_page)
        if (self.show_all and self.can_show_all) or not self.multi_page:
            self.result_list = rows[0:result_count]
        else:
            try:
                number = self.paginator.validate_number(self.page_num)
            except InvalidPage:
                raise IncorrectLookupParameters from None
            depth = getattr(self.model_admin, "shard_list_depth", None)
            if depth is not None and number * self.list_per_page > depth:
                self.result_list = []
                self.model_admin.message_user(request, (
                    f"Page {number} is past the first {depth:,} rows, the deepest a list over "
                    f"{len(shards.shards())} shards reads from each shard: filter, search or reverse the "
                    "order to reach these rows."), messages.WARNING)
            else:
                self.result_list = self.paginator.page(number).object_list
        for alias, reason in rows.unreachable.items():
            self.model_admin.message_user(request, (
                f"Shard “{alias}” could not be read ({reason}): its rows are not in this list; the other "
                "shards' rows are."), messages.ERROR)

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
    shard_list_depth = 10_000  # the most rows a merged list reads from each shard for one page (ShardedChangeList)

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
        """The shard of a row asked for without `?shard=`: the first shard that holds the id, or None.
        ShardUnreachable when a shard that could hold it cannot be read (and no reachable one holds it)."""
        if stored_id_problem(object_id) is not None:
            return None
        missed: ShardUnreachable | None = None
        for alias in shards.shards():
            try:
                if self.model._base_manager.using(alias).filter(pk=object_id).exists():
                    return alias
            except (ValueError, TypeError, ValidationError):  # not an id of this model at all
                return None
            except UNREACHABLE as error:
                missed = missed or ShardUnreachable(alias, error)
        if missed is not None:
            raise missed
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
        request.loom_shard = alias  # the page's links carry it (get_preserved_filters)
        with shards.bound(alias) if alias else nullcontext():
            yield alias

    def get_preserved_filters(self, request) -> str:
        """Django's, plus `shard=<alias>` on a row's pages: the change page's links that read the row again
        (History, and a form's redirects) open it on the shard it was read from, not the first shard holding
        its id. The changelist link keeps only the list's own filters (Django unwraps _changelist_filters)."""
        preserved = super().get_preserved_filters(request)
        alias = getattr(request, "loom_shard", None)
        if not alias:
            return preserved
        return "&".join(filter(None, [preserved, urlencode({SHARD_PARAM: alias})]))

    def row_page(self, request, object_id: str, render) -> object:
        """`render()` (a row's page) on the row's shard, rendered while it is bound; a shard that cannot be
        read answers 503 naming it (shard_unreachable), not a traceback."""
        try:
            with self.on_row_shard(request, object_id):
                return _rendered(render())
        except UNREACHABLE as error:
            if not spans_shards(self):  # one database: Django's own error, as ever
                raise
            return self.shard_unreachable(request, ShardUnreachable(getattr(request, "loom_shard", None) or "?",
                                                                    error))
        except ShardUnreachable as error:
            return self.shard_unreachable(request, error)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        return self.row_page(request, object_id,
                             lambda: super(ShardedAdmin, self).change_view(request, object_id, form_url, extra_context))

    def history_view(self, request, object_id, extra_context=None):
        return self.row_page(request, object_id,
                             lambda: super(ShardedAdmin, self).history_view(request, object_id, extra_context))

    def shard_unreachable(self, request, error: ShardUnreachable) -> TemplateResponse:
        """A row's page whose shard cannot be read: 503 and the shard named, not a traceback."""
        context = {**self.admin_site.each_context(request), "opts": self.model._meta, "alias": error.alias,
                   "reason": error.reason, "title": "Shard unreachable"}
        return TemplateResponse(request, "journal/shard_unreachable.html", context, status=503)

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
