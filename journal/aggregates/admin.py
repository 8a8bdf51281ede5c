"""Read-only admin pages for aggregates: each declared state, its streams, and one stream's events
with its current state computed on view (a replay that bypasses the cache, so it shows the log's truth).

Registered with the admin site by journal/admin.py on `journal.models.AggregateStream` (a proxy of
Event), so the pages are listed on the admin index ("Aggregates"), live under
/admin/journal/aggregatestream/ with no URL of the project's own, render with the admin's context
(user, logout form, breadcrumbs, styles) and need the view permission journal.view_aggregatestream.
journal/aggregates/urls.py serves the same views for projects that mounted /admin/aggregates/.
A state's streams are found by its stream prefix (see State.prefix).
"""

from __future__ import annotations

import json

import django
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import CharField, Count, Max, Value
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse

from journal import shards
from journal.admin_base import ReadOnlyAdmin
from journal.admin_shards import ShardedRows
from journal.aggregates.declarations import State, states
from journal.aggregates.errors import AggregateError, CompactedStream
from journal.aggregates.runtime import META, fold_events, replay
from journal.exceptions import InvalidStream, PrivacyError
from journal.ids import check_stored_id
from journal.models import AggregateStream, Event
from journal.privacy import Reader, reader_for_user
from journal.privacy.codec import disclose_model
from journal.timestamps import stamp

STREAMS_PER_PAGE = 50
EVENTS_SHOWN = 500


def _render(request: HttpRequest, template: str, context: dict) -> HttpResponse:
    """An admin page: the site's context (user, logout, site header), the model's opts for breadcrumbs."""
    model_admin = admin.site._registry.get(AggregateStream)
    site = model_admin.admin_site if model_admin else admin.site
    if model_admin is not None and not model_admin.has_view_permission(request):
        raise PermissionDenied
    ctx = {**site.each_context(request), "opts": AggregateStream._meta, "ol_breadcrumbs": django.VERSION >= (6, 0),
           **context}
    return TemplateResponse(request, f"journal/aggregates/{template}", ctx)


def _crumbs(state: State | None = None, id: str | None = None) -> list[tuple[str, str | None]]:
    """Home > Loom journal > Aggregates > state > id (the last one is the current page)."""
    crumbs = [(AggregateStream._meta.app_config.verbose_name, reverse("admin:app_list", args=["journal"])),
              ("Aggregates", reverse("admin:journal_aggregatestream_changelist") if state else None)]
    if state is not None:
        crumbs.append((state.name, reverse("admin:journal_aggregate_streams", args=[state.name]) if id else None))
    if id is not None:
        crumbs.append((id, None))
    return crumbs


def _state(name: str) -> State:
    found = states().get(name)
    if found is None:
        raise Http404(f"no aggregate state named {name}")
    return found


def _streams(state: State, alias: str, query: str = ""):
    """The state's streams on one shard (`alias`), one row each (its version, events, last event), by stream id;
    each row names its shard (a stream's events all live on one shard: journal/shards.py)."""
    found = Event.objects.using(alias).filter(stream_id__startswith=state.prefix)
    if query:
        found = found.filter(stream_id__contains=query)
    return (found.values("stream_id")
            .annotate(version=Max("seq"), events=Count("id"), updated=Max("recorded_at"),
                      shard=Value(alias, output_field=CharField())).order_by("stream_id"))


def index(request: HttpRequest) -> HttpResponse:
    """Every declared state with its event types and actions."""
    rows = [
        {"name": st.name, "prefix": st.prefix, "events": sorted(st.events), "deprecated": sorted(st.deprecated),
         "actions": sorted(st.actions), "snapshot_every": st.snapshot_every}
        for st in sorted(states().values(), key=lambda s: s.name)
    ]
    return _render(request, "index.html", {"title": "Aggregates", "states": rows, "crumbs": _crumbs()})


def stream_list(request: HttpRequest, state: str) -> HttpResponse:
    """The streams of one state, paginated, optionally filtered by an id substring (`?q=`)."""
    st = _state(state)
    query = request.GET.get("q", "").strip()
    # Every shard's streams (LOOM_SHARDS; else the one database the journal lives on), merged by stream id and
    # paged over all of them (admin_shards.ShardedRows: one COUNT per shard, a page reads its end's worth of rows
    # from each). A shard that cannot be read is left out and named on the page; the others are listed.
    streams = ShardedRows([_streams(st, alias, query) for alias in shards.shards()], skip_unreachable=True)
    page = Paginator(streams, STREAMS_PER_PAGE).get_page(request.GET.get("page"))
    for row in page.object_list:
        row["id"] = row["stream_id"][len(st.prefix):]
        row["when"] = stamp(row["updated"])
    return _render(request, "streams.html", {"title": f"{st.name} aggregates", "state": st, "page": page, "q": query,
                                             "crumbs": _crumbs(st), "sharded": shards.sharded(),
                                             "unreachable": sorted(streams.unreachable.items())})


def stream_detail(request: HttpRequest, state: str, id: str) -> HttpResponse:
    """One aggregate: its current state (replayed now) and its latest events, newest last; read on the stream's
    shard (journal/shards.py: its events, its snapshot and where a compaction left it all live there)."""
    st = _state(state)
    try:
        stream = check_stored_id(st.stream(id), f"stream id of {st.name}")
    except InvalidStream as exc:  # no such stream can exist
        raise Http404(str(exc)) from None
    with shards.on_stream(stream):
        return _stream_detail(request, st, id)


def _stream_detail(request: HttpRequest, st: State, id: str) -> HttpResponse:
    stream = st.stream(id)
    total = Event.objects.filter(stream_id=stream).count()
    if not total:
        raise Http404(f"stream {stream} has no events")
    # A compacted stream starts at its kept snapshot's seq (journal/compaction.py): the latest events are the
    # ones after tip - EVENTS_SHOWN, and the page says where its history begins.
    first = Event.objects.filter(stream_id=stream).order_by("seq").values_list("seq", flat=True).first()
    tip = first + total - 1
    reader = reader_for_user(request.user)  # sensitive fields as this user may see them (docs/privacy.md)
    events = Event.objects.read(stream, after_seq=max(-1, tip - EVENTS_SHOWN), reader=reader)
    try:
        agg = replay(st, id)
        state = agg.state
        if st.sensitive and first:  # its snapshot is never read: the kept events alone would fold wrongly
            raise CompactedStream(stream, first, f"{st.name} is sensitive now (its snapshots are never read)")
        if st.sensitive:  # folded from the events as this user sees them: a value it may not see is not in it
            state = _fold_as(st, stream, reader)
        shown = disclose_model(st.schema, state.model_dump(mode="json"), reader) if state is not None else None
        current, error = json.dumps(shown, indent=2, sort_keys=True), ""
        if shown is None:
            error = ("The current state is withheld: it folds personal data this user may not see "
                     "(docs/privacy.md, disclosure).")
    except (AggregateError, PrivacyError) as exc:  # a stream that no longer folds is shown, with the reason
        agg, current, error = None, "", str(exc)
    rows = []
    for ev in events:
        payload = dict(ev.payload) if isinstance(ev.payload, dict) else {"value": ev.payload}
        meta = payload.pop(META, {}) or {}
        rows.append({"seq": ev.seq, "type": ev.type, "recorded_at": ev.recorded_at,
                     "deprecated": ev.type in st.deprecated, "action": meta.get("action", ""),
                     "actor": json.dumps(meta.get("actor")), "payload": json.dumps(payload, sort_keys=True),
                     "when": stamp(ev.recorded_at)})
    return _render(request, "detail.html", {
        "title": f"{st.name} {id}", "state": st, "id": id, "stream": stream, "agg": agg, "current": current,
        "error": error, "events": rows, "total": total, "truncated": total > len(rows), "crumbs": _crumbs(st, id),
        "compacted_before": first,
    })


def _fold_as(st, stream: str, reader: Reader):
    """The state of a sensitive aggregate folded from its events as `reader` sees them (WITHHELD where it may
    not see a field), or None when those events do not fold (a withheld value where the state needs, say, an
    int): the state is then withheld whole."""
    try:
        return fold_events(st, stream, Event.objects.read(stream, reader=reader))
    except AggregateError:
        return None


class AggregateAdmin(ReadOnlyAdmin):
    """The pages above as the admin of the AggregateStream proxy: its list is the index of states."""

    def changelist_view(self, request, extra_context=None):
        return index(request)

    def get_urls(self):
        wrap = self.admin_site.admin_view
        return [
            path("", wrap(index), name="journal_aggregatestream_changelist"),
            path("<str:state>/", wrap(stream_list), name="journal_aggregate_streams"),
            path("<str:state>/<path:id>/", wrap(stream_detail), name="journal_aggregate_detail"),
        ]


urlpatterns_views = {
    "index": admin.site.admin_view(index),
    "streams": admin.site.admin_view(stream_list),
    "detail": admin.site.admin_view(stream_detail),
}
