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
"""

from __future__ import annotations

import re

from journal.exceptions import InvalidStream

MAX_ID_LENGTH = 200

_SEPARATORS = re.compile(r"[/\\]")
_DOT_SEGMENTS = frozenset({".", "..", "%2e", ".%2e", "%2e.", "%2e%2e"})


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


def _shown(value: object) -> str:
    """The value for an error message: ascii() so that invisible characters are visible."""
    text = ascii(value)
    return text if len(text) <= 80 else text[:77] + "..."
