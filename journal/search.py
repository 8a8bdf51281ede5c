"""Finding executions: one search over id, flow, input and error, shared by the admin's search box and
`manage.py loom executions list --search` (issue #28).

A term matches an execution whose id or flow contains it, whose input (the header's JSON text, as stored)
contains it, or whose error text contains it, case-insensitively. The header's input keeps a field marked
sensitive as `"<redacted>"` (docs/privacy.md), so a sealed value is never found by its clear text, before or
after its subject is forgotten; the error text has the marked values the run held cut out the same way.

No index serves a substring search: docs/backends.md "Searching executions" gives the index plan for large
journals (pg_trgm GIN indexes on PostgreSQL, created by the operator; a scan bounded by the date range on
SQLite).
"""

from __future__ import annotations

from django.db.models import Q, QuerySet, TextField
from django.db.models.functions import Cast

INPUT_TEXT = "loom_input_text"
"""The annotation holding the input's JSON text (PostgreSQL: `input::text`; SQLite: the stored text)."""


def search(rows: QuerySet, term: str) -> QuerySet:
    """`rows` narrowed to the executions matching `term` (stripped; an empty term matches everything)."""
    term = term.strip()
    if not term:
        return rows
    rows = rows.annotate(**{INPUT_TEXT: Cast("input", TextField())})
    return rows.filter(Q(id__icontains=term) | Q(flow__icontains=term) | Q(**{f"{INPUT_TEXT}__icontains": term})
                       | Q(error__icontains=term))


def error_line(error: str, width: int = 120) -> str:
    """The first line of an error text, at most `width` characters (the list's error column)."""
    first = (error or "").strip().splitlines()[0] if (error or "").strip() else ""
    return first if len(first) <= width else first[: width - 1] + "…"
