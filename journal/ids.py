"""The id alphabet: one rule for stream ids, execution ids and aggregate streams, checked everywhere.

An id is pasted into URLs (`/api/executions/<id>`, the admin), log lines and SQL parameters, so it
must read the same to a person, a browser and the database. The rule:

- a `str` of 1 to 200 characters (`MAX_ID_LENGTH`, the width of the `stream_id` columns; for an
  aggregate this counts its stream prefix, e.g. `Ticket-`);
- every character printable and none a space: `str.isprintable()` refuses the Unicode categories
  Cc (controls, NUL, C1 controls), Cf (bidi overrides, zero-width characters, the BOM), Cs (lone
  surrogates, which UTF-8 cannot encode), Co (private use), Cn (unassigned) and every separator
  (Zs, Zl, Zp) except the ASCII space, which is refused on its own;
- no path segment (between `/` or `\\`) that a browser or proxy would resolve as a dot segment:
  `.`, `..` and their percent-encoded spellings (`%2e`, `.%2E`, ...), so `../../admin` cannot
  climb out of the URL it is pasted into.

Letters of any script, digits, punctuation and symbols (`order-42`, `Ticket:42`, `a/b`, `ü`) are in.
The check is a handful of C-level string operations: cheap enough for every append and read.

Where the alphabet is enforced: where an id is CREATED (`check_id`): `open_stream`, a flow's start
(`flows.start`, `enqueue_start`, the HTTP API), an aggregate's first event, and any append that could
create a stream: one without a fence token and without an `expected_seq` of 0 or more. Everywhere
else (reads, `resume`, `cancel`, `retry`, recovery, fence advances, guarded appends, whose guards
refuse a stream that does not exist) an id only has to be one the database can store
(`check_stored_id`: a non-empty `str` of at most 200 characters without NUL or lone surrogates), so
streams and executions created before the alphabet existed (`order\u200b42`) stay readable and
operable. `manage.py check --database default` lists such stored ids (loom.W020).
"""

from __future__ import annotations

import re

from django.core.checks import Tags, register

from journal.exceptions import InvalidStream

MAX_ID_LENGTH = 200

_SEPARATORS = re.compile(r"[/\\]")
_DOT_SEGMENTS = frozenset({".", "..", "%2e", ".%2e", "%2e.", "%2e%2e"})
_SURROGATE = re.compile("[\ud800-\udfff]")


def id_problem(value: object) -> str | None:
    """Why `value` is not a valid id, or None if it is."""
    if not isinstance(value, str):
        return f"an id is a string, not {type(value).__name__}"
    if not value:
        return "an id is not empty"
    if len(value) > MAX_ID_LENGTH:
        return f"an id has at most {MAX_ID_LENGTH} characters, this one has {len(value)}"
    if not value.isprintable() or " " in value:
        return "an id has no whitespace, control, format (bidi, zero-width, BOM) or surrogate characters"
    if ("." in value or "%" in value) and any(
        segment.lower() in _DOT_SEGMENTS for segment in _SEPARATORS.split(value)
    ):
        return "an id has no '.' or '..' path segment"
    return None


def check_id(value: object, what: str = "stream id") -> str:
    """`value` if it is a valid id; InvalidStream (naming `what`) otherwise."""
    if type(value) is str and 0 < len(value) <= MAX_ID_LENGTH and value.isprintable() and " " not in value \
            and "." not in value and "%" not in value:
        return value  # the common case, decided without building a message
    problem = id_problem(value)
    if problem is not None:
        raise InvalidStream(f"invalid {what} {_shown(value)}: {problem}")
    return value  # type: ignore[return-value]


def stored_id_problem(value: object) -> str | None:
    """Why `value` cannot be an id the database stores (NUL, lone surrogate, empty, too long), or None."""
    if not isinstance(value, str):
        return f"an id is a string, not {type(value).__name__}"
    if not value:
        return "an id is not empty"
    if len(value) > MAX_ID_LENGTH:
        return f"an id has at most {MAX_ID_LENGTH} characters, this one has {len(value)}"
    if "\x00" in value:
        return "an id has no NUL character (PostgreSQL cannot store it)"
    if not value.isascii() and _SURROGATE.search(value):
        return "an id has no lone surrogate (it has no UTF-8 encoding)"
    return None


def check_stored_id(value: object, what: str = "stream id") -> str:
    """`value` if the database can hold it as an id (reads and operations on existing streams: ids stored
    before the alphabet stay usable); InvalidStream otherwise. Creation checks the alphabet (check_id)."""
    if type(value) is str and 0 < len(value) <= MAX_ID_LENGTH and value.isprintable():
        return value  # the common case: in the alphabet's printable part, so storable
    problem = stored_id_problem(value)
    if problem is not None:
        raise InvalidStream(f"invalid {what} {_shown(value)}: {problem}")
    return value  # type: ignore[return-value]


def check_stored_ids(databases: list[str] | None = None, **kwargs) -> list:
    """System check (tag `database`, run by `manage.py check --database <alias>`): stream and execution ids
    stored outside the alphabet (created before it was enforced). They stay readable and operable; new ones
    cannot be created. A warning per database, naming up to 20 of them (ascii() so they are visible)."""
    from django.core.checks import Warning as CheckWarning
    from django.db import connections

    from journal.models import Event

    found = []
    for alias in databases or []:
        if Event._meta.db_table not in connections[alias].introspection.table_names():
            continue  # not migrated yet (`migrate` runs the database checks before it creates the tables)
        bad = []
        ids = Event.objects.using(alias).order_by().values_list("stream_id", flat=True).distinct()
        for stream_id in ids.iterator(chunk_size=2000):
            if id_problem(stream_id) is not None:
                bad.append(stream_id)
        if bad:
            shown = ", ".join(_shown(i) for i in bad[:20]) + (", ..." if len(bad) > 20 else "")
            found.append(CheckWarning(
                f"{len(bad)} stream or execution id(s) in database {alias!r} are outside the id alphabet: {shown}",
                hint="They were stored before the alphabet (journal/ids.py) was enforced; they can still be read, "
                     "resumed, cancelled, retried and recovered, but no new id like them can be created. "
                     "Rename at your leisure (a new stream) if URLs or logs matter.",
                id="loom.W020",
            ))
    return found


def _shown(value: object) -> str:
    """The value for an error message: ascii() so that invisible characters are visible."""
    text = ascii(value)
    return text if len(text) <= 80 else text[:77] + "..."


register(check_stored_ids, Tags.database)
