"""`GET executions`: the executions a token may read, newest first, one page at a time (issue #28).

Query parameters (every one optional; anything else, a repeated one, or a value out of shape is a 400
`invalid_parameter` naming it, and nothing is read):

- `flow`: one flow's name; `status`: one of STATUSES;
- `created_after`, `created_before`: ISO 8601 times (UTC when they name no zone), an open range;
- `limit`: 1 to MAX_LIMIT (default 50); `cursor`: the `next_cursor` of the previous page.

Scopes (loomapi/auth.py): a token sees only executions of the flows it may use (an internal flow it may not
use included), and with `"read": "own"` only those it started: the others are not counted, not hinted at,
exactly as if they did not exist. The page is ordered by (created_at, id) descending and the cursor is that
pair of the page's last row, so rows written while a caller pages never repeat a row or skip an older one.
With LOOM_SHARDS every shard is read and merged (each shard's first `limit` rows past the cursor); unsharded, the
one database the project's routers give the journal (journal/shards.py `shards()`, as describe() and the admin).
A shard that cannot be reached answers 503 `database_unavailable` naming it (retryable), not a page without it.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import InterfaceError, OperationalError
from django.db.models import Exists, OuterRef, Q

from journal import shards
from journal.exceptions import ContentMissing, InvalidStream
from journal.ids import check_stored_id
from journal.models import Event, Execution
from journal.reach import cannot_reach
from loomapi.auth import Principal
from loomapi.errors import DatabaseUnavailable, InvalidParameter

MAX_LIMIT = 200
PARAMETERS = ("flow", "status", "created_after", "created_before", "limit", "cursor")
STATUSES = ("queued", "running", "waiting", "suspended", "stuck", "completed", "failed", "cancelled")


@dataclass(frozen=True, slots=True)
class ListQuery:
    flow: str | None = None
    status: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    limit: int = 50
    cursor: tuple[datetime, str] | None = None


def list_query(params) -> ListQuery:
    """The checked query of a request's GET parameters (a QueryDict); InvalidParameter names the first problem."""
    unknown = sorted(set(params) - set(PARAMETERS))
    if unknown:
        raise InvalidParameter(f"unknown query parameter(s) {unknown}; this endpoint takes {list(PARAMETERS)}")
    values = {}
    for name in params:
        given = params.getlist(name)
        if len(given) != 1:
            raise InvalidParameter(f"{name} is given {len(given)} times; give it once")
        values[name] = given[0]
    for name, text in values.items():
        if "\x00" in text or any("\ud800" <= ch <= "\udfff" for ch in text) or len(text) > 400:
            raise InvalidParameter(f"{name}: at most 400 characters of text the database can hold")
    status = values.get("status")
    if status is not None and status not in STATUSES:
        raise InvalidParameter(f"status {status[:40]!r}: one of {', '.join(STATUSES)}")
    flow = values.get("flow")
    if flow is not None and not flow.strip():
        raise InvalidParameter("flow: a flow's name, not empty")
    return ListQuery(flow=flow, status=status, created_after=_time(values, "created_after"),
                     created_before=_time(values, "created_before"), limit=_limit(values.get("limit")),
                     cursor=_cursor(values.get("cursor")))


def _time(values: dict, name: str) -> datetime | None:
    text = values.get(name)
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise InvalidParameter(f"{name} {text[:40]!r}: an ISO 8601 time (2026-12-01T10:00:00Z)") from None
    moment = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    try:
        moment.astimezone(UTC)
    except OverflowError:
        raise InvalidParameter(f"{name} {text[:40]!r}: out of range") from None
    return moment


def _limit(text: str | None) -> int:
    if text is None:
        return 50
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= MAX_LIMIT:
        raise InvalidParameter(f"limit {text[:40]!r}: a whole number from 1 to {MAX_LIMIT}")
    return int(text)


def cursor_of(created_at: datetime, execution_id: str) -> str:
    """The opaque cursor after a row: base64url of `<ISO time>|<id>`."""
    raw = f"{created_at.astimezone(UTC).isoformat()}|{execution_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _cursor(text: str | None) -> tuple[datetime, str] | None:
    if text is None:
        return None
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
        when, sep, execution_id = raw.partition("|")
        moment = datetime.fromisoformat(when)
        if not sep or not execution_id or moment.tzinfo is None:
            raise ValueError(raw)
        moment = moment.astimezone(UTC)  # OverflowError at the ends of the range: the database adapts it so
        check_stored_id(execution_id, "cursor id")  # a NUL (PostgreSQL's DataError), a surrogate, too long
    except (ValueError, OverflowError, binascii.Error, UnicodeDecodeError, InvalidStream):
        raise InvalidParameter("cursor: not a next_cursor this endpoint gave") from None
    return moment, execution_id


def page(principal: Principal, query: ListQuery) -> dict:
    """One page of the executions `principal` may read that match `query`, every shard merged."""
    rows = []
    for alias in shards.shards():  # the journal's databases: LOOM_SHARDS, or the one the project routes it to
        try:
            rows += _page_on(alias, principal, query)
        except (OperationalError, InterfaceError) as exc:
            if not cannot_reach(exc) or not shards.sharded():
                raise  # one database: the API's own 503 (loomapi/views.py) says it
            # Not a partial page: its cursor would step past the down shard's rows for good.
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise DatabaseUnavailable(f"shard {alias!r} could not be read ({first}); no page without it: retry"
                                      ) from exc
    rows.sort(key=lambda r: (r["created_at"], r["execution_id"]), reverse=True)
    more = len(rows) > query.limit
    rows = rows[: query.limit]
    last = rows[-1] if rows and more else None
    return {"executions": rows, "next_cursor": cursor_of(last["created_at"], last["execution_id"]) if last else None}


def _page_on(alias: str, principal: Principal, query: ListQuery) -> list[dict]:
    """One database's first `limit` + 1 rows past the cursor (the extra one says whether a next page exists)."""

    # The flows this token may use, out of the distinct flow names on this database (a short list: one
    # per registered flow, read through the flow index), so that scope is a plain `flow IN (...)`.
    named = Execution.objects.using(alias).order_by().values_list("flow", flat=True).distinct()
    allowed = [flow for flow in named if principal.may_use(flow)]
    if query.flow is not None:
        allowed = [flow for flow in allowed if flow == query.flow]
    if not allowed:
        return []
    rows = Execution.objects.using(alias).filter(flow__in=allowed)
    if not principal.read_all:  # "read": "own": started by this token ($meta of its EXECUTION_STARTED)
        first = Event.objects.using(alias).filter(stream_id=OuterRef("pk"), seq=0)
        # A start stored in the content store (LOOM_CONTENT_THRESHOLD_BYTES: `{"$content", "$size"}` in the
        # row) hides its $meta from SQL: such rows are candidates, decided after reading them (_own).
        rows = rows.annotate(loom_apart=Exists(first.filter(payload__has_key="$content"))).filter(
            Exists(first.filter(**{"payload__$meta__started_by": principal.name})) | Q(loom_apart=True))
    if query.status is not None:
        rows = rows.filter(status=query.status)
    if query.created_after is not None:
        rows = rows.filter(created_at__gte=query.created_after)
    if query.created_before is not None:
        rows = rows.filter(created_at__lt=query.created_before)
    fields = ("id", "flow", "status", "created_at", "updated_at", "finished_at", "error")
    rows = rows.order_by("-created_at", "-id").values(*fields, *(() if principal.read_all else ("loom_apart",)))
    found: list[dict] = []
    cursor = query.cursor
    while True:  # one chunk unless candidates stored apart turn out to be another token's
        chunk = list(rows.filter(_after(cursor))[: query.limit + 1] if cursor else rows[: query.limit + 1])
        found += _own(principal, chunk) if not principal.read_all else chunk
        if len(found) > query.limit or len(chunk) <= query.limit:
            break
        cursor = chunk[-1]["created_at"], chunk[-1]["id"]
    return [{"execution_id": r["id"], "flow": r["flow"], "status": r["status"], "created_at": r["created_at"],
             "updated_at": r["updated_at"], "finished_at": r["finished_at"], "error": r["error"] or None,
             **({"shard": alias} if shards.sharded() else {})} for r in found[: query.limit + 1]]


def _after(cursor: tuple[datetime, str]) -> Q:
    when, execution_id = cursor
    return Q(created_at__lt=when) | Q(created_at=when, id__lt=execution_id)


def _own(principal: Principal, rows: list[dict]) -> list[dict]:
    """`rows` less the candidates whose start is stored apart and was not made by this token: each is read
    through the journal (its content resolved, as `GET /api/executions/<id>` reads it)."""

    kept = []
    for row in rows:
        if row["loom_apart"]:
            try:
                events = Event.objects.read(row["id"], limit=1)
            except ContentMissing:  # its content erased: nothing says who started it, so it is not shown
                continue
            payload = events[0].payload if events and events[0].seq == 0 else None
            meta = payload.get("$meta") if isinstance(payload, dict) else None
            if not isinstance(meta, dict) or meta.get("started_by") != principal.name:
                continue
        kept.append(row)
    return kept
