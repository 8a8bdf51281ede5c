"""Read-only admin pages for aggregates: each declared state, its streams, and one stream's events
with its current state computed on view (a replay that bypasses the cache, so it shows the log's truth).

Mounted by the project (see docs/aggregates.md) at /admin/aggregates/ (staff only, through `admin.site.admin_view`).
Pages, not a ModelAdmin: a proxy model of Event would need a migration in the journal app, and
these pages only read. A state's streams are found by its stream prefix (see State.prefix).
"""

from __future__ import annotations

import json
from pathlib import Path

from django.contrib import admin
from django.core.paginator import Paginator
from django.db.models import Count, Max
from django.http import Http404, HttpRequest, HttpResponse
from django.template import Context, Engine

from journal.aggregates.declarations import State, states
from journal.aggregates.errors import AggregateError
from journal.aggregates.runtime import META, replay
from journal.models import Event

TEMPLATES = Path(__file__).resolve().parent / "templates"
STREAMS_PER_PAGE = 50
EVENTS_SHOWN = 500


def _render(request: HttpRequest, template: str, context: dict) -> HttpResponse:
    # Our templates live beside this module (journal/aggregates is not an app of its own), and
    # extend the admin's base template through the default engine's loaders.
    engine = Engine.get_default()
    text = (TEMPLATES / template).read_text()
    ctx = {**admin.site.each_context(request), **context}
    return HttpResponse(engine.from_string(text).render(Context(ctx, autoescape=True)))


def _state(name: str) -> State:
    found = states().get(name)
    if found is None:
        raise Http404(f"no aggregate state named {name}")
    return found


def _streams(state: State):
    return (Event.objects.filter(stream_id__startswith=state.prefix).values("stream_id")
            .annotate(version=Max("seq"), events=Count("id"), updated=Max("recorded_at")).order_by("stream_id"))


def index(request: HttpRequest) -> HttpResponse:
    """Every declared state with its event types and actions."""
    rows = [
        {"name": st.name, "prefix": st.prefix, "events": sorted(st.events), "deprecated": sorted(st.deprecated),
         "actions": sorted(st.actions), "snapshot_every": st.snapshot_every}
        for st in sorted(states().values(), key=lambda s: s.name)
    ]
    return _render(request, "aggregates_index.html", {"title": "Aggregates", "states": rows})


def stream_list(request: HttpRequest, state: str) -> HttpResponse:
    """The streams of one state, paginated, optionally filtered by an id substring (`?q=`)."""
    st = _state(state)
    query = request.GET.get("q", "").strip()
    streams = _streams(st)
    if query:
        streams = streams.filter(stream_id__contains=query)
    page = Paginator(streams, STREAMS_PER_PAGE).get_page(request.GET.get("page"))
    for row in page.object_list:
        row["id"] = row["stream_id"][len(st.prefix):]
    return _render(request, "aggregates_streams.html",
                   {"title": f"{st.name} aggregates", "state": st, "page": page, "q": query})


def stream_detail(request: HttpRequest, state: str, id: str) -> HttpResponse:
    """One aggregate: its current state (replayed now) and its latest events, newest last."""
    st = _state(state)
    stream = st.stream(id)
    total = Event.objects.filter(stream_id=stream).count()
    if not total:
        raise Http404(f"stream {stream} has no events")
    events = Event.objects.read(stream, after_seq=max(-1, total - 1 - EVENTS_SHOWN))
    try:
        agg = replay(st, id)
        current, error = json.dumps(agg.state.model_dump(mode="json"), indent=2, sort_keys=True), ""
    except AggregateError as exc:  # a stream that no longer folds is shown, with the reason
        agg, current, error = None, "", str(exc)
    rows = []
    for ev in events:
        payload = dict(ev.payload) if isinstance(ev.payload, dict) else {"value": ev.payload}
        meta = payload.pop(META, {}) or {}
        rows.append({"seq": ev.seq, "type": ev.type, "recorded_at": ev.recorded_at,
                     "deprecated": ev.type in st.deprecated, "action": meta.get("action", ""),
                     "actor": json.dumps(meta.get("actor")), "payload": json.dumps(payload, sort_keys=True)})
    return _render(request, "aggregates_detail.html", {
        "title": f"{st.name} {id}", "state": st, "id": id, "stream": stream, "agg": agg, "current": current,
        "error": error, "events": rows, "total": total, "truncated": total > len(rows),
    })


urlpatterns_views = {
    "index": admin.site.admin_view(index),
    "streams": admin.site.admin_view(stream_list),
    "detail": admin.site.admin_view(stream_detail),
}
