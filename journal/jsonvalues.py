"""The JSON boundary: what a payload may hold, and the one text both databases store for it.

Every payload, snapshot state and flow input is encoded here before any SQL runs, so that what a
reader gets back is what the writer gave, the same on SQLite (the text, stored as is) and on
PostgreSQL (jsonb, which re-parses numbers as `numeric`). The rules (docs/architecture.md):

Accepted, read back equal (same types, same values):
- dict with `str` keys, list, str, int (any size Python prints: up to 4300 digits), float (finite),
  bool, None, nested at most `MAX_DEPTH` levels.

Normalised (documented, the same on both backends):
- a tuple comes back as a list; a subclass of str/int/float/dict/list as the plain type;
- `-0.0` comes back as `0.0` (jsonb's numeric has no negative zero);
- a float printed with a positive exponent (`4.205453796612399e+16`, `1e300`) is written out in
  full with a `.0` (`42054537966123990.0`): jsonb would otherwise store `42054537966123990`, which
  reads back as an int. The value read back is the same float;
- the order of an object's keys is not kept (jsonb sorts them).

Refused with InvalidPayload (nothing is written):
- keys that are not strings (JSON would silently turn `1` into `"1"`), NaN and the infinities,
  objects JSON cannot encode, cycles, nesting deeper than `MAX_DEPTH`;
- NUL (`\\x00`) anywhere, in a key or a value (jsonb cannot store it); the six characters
  backslash-u-0-0-0-0 as text are fine;
- lone surrogates (`\\ud800`), which have no UTF-8 encoding.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from typing import Any

from journal.exceptions import InvalidPayload

MAX_DEPTH = 100
"""Deepest nesting of lists and objects a value may have (a scalar at the top is depth 0)."""

_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
# The same C encoder, made once and without the cycle markers (issue 33): JSONEncoder.encode builds a new C
# encoder and a markers dict per call, which was 60 % of its time for a 256-byte payload (2.3 us against
# 0.9 us). Markers cannot be shared between threads (one thread's entries would be another's "cycle"), so
# this one has none: a cycle becomes a RecursionError, and any failure is encoded again by `_ENCODER`,
# whose error is the one the caller gets. Same arguments as `_ENCODER.iterencode` passes: the same text.
_FAST_ENCODER = (json.encoder.c_make_encoder(None, _ENCODER.default, json.encoder.encode_basestring, None, ":", ",",
                                             False, False, False)
                 if json.encoder.c_make_encoder is not None else None)
_PLAIN = frozenset({str, int, float, bool, type(None)})
_STR = frozenset({str})
_SMALL = 32  # a container this small is looped; a larger one is first checked by C-level passes
_SURROGATE = re.compile("[\ud800-\udfff]")
# A JSON escape of NUL: "\u0000" preceded by an even number of backslashes (an odd number means
# the backslash before "u0000" is itself escaped: the text holds a backslash, not a NUL).
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
# A string (skipped as is), or a number jsonb would change: a positive exponent, or negative zero.
_NUMBER_TO_FIX = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|(-?\d(?:\.\d+)?e\+\d+|-0\.0(?=[,\]}]|$))')


def dumps(value: Any, what: str = "payload") -> str:
    """The JSON text stored for `value`; InvalidPayload (naming `what`) if it may not be stored."""
    try:
        text = "".join(_FAST_ENCODER(value, 0))
    except Exception:  # anything (a cycle, a type it cannot encode): the stdlib path below says what
        text = None
    try:
        if text is None:
            text = _ENCODER.encode(value)
    except RecursionError:
        raise InvalidPayload(f"{what} is nested deeper than {MAX_DEPTH} levels") from None
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(f"{what} is not JSON-serialisable: {exc}") from None
    if ("{" in text or "[" in text) and (len(text) < 4096 or _needs_walk(value, text)):
        problem = _structure_problem(value)
        if problem is not None:
            raise InvalidPayload(f"{what} {problem}")
    if not text.isascii() and _SURROGATE.search(text):
        raise InvalidPayload(f"{what} contains a lone surrogate, which has no UTF-8 encoding")
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        raise InvalidPayload(f"{what} contains a NUL character, which PostgreSQL cannot store")
    if "e+" in text or "-0.0" in text:
        text = _NUMBER_TO_FIX.sub(_fix_number, text)
    return text


def problem(value: Any, what: str = "value") -> str | None:
    """Why `value` may not be stored, or None (for callers that report rather than raise)."""
    try:
        dumps(value, what)
    except InvalidPayload as exc:
        return str(exc)
    return None


def _structure_problem(node: Any, depth: int = 1) -> str | None:
    """A key that is not a string, or nesting deeper than MAX_DEPTH. Only containers are visited: in a
    large one, C-level passes (`set(map(type, ...))`) decide whether every key is a str and every child
    a scalar before any Python loop; a small one is looped (cheaper than building the sets). The
    recursion is bounded by MAX_DEPTH."""
    if depth > MAX_DEPTH:
        return f"is nested deeper than {MAX_DEPTH} levels"
    if isinstance(node, dict):
        if len(node) > _SMALL:
            if not set(map(type, node)) <= _STR:
                return _key_problem(node)
            node = node.values()
            if set(map(type, node)) <= _PLAIN:
                return None
        else:
            for key, child in node.items():
                if type(key) is not str and not isinstance(key, str):
                    return _key_problem(node)
                if type(child) not in _PLAIN:
                    problem = _structure_problem(child, depth + 1)
                    if problem is not None:
                        return problem
            return None
    elif not isinstance(node, (list, tuple)) or (len(node) > _SMALL and set(map(type, node)) <= _PLAIN):
        return None
    for child in node:
        if type(child) not in _PLAIN:
            problem = _structure_problem(child, depth + 1)
            if problem is not None:
                return problem
    return None


def _key_problem(node: dict) -> str | None:
    for key in node:
        if not isinstance(key, str):
            return f"has a key that is not a string: {key!r} (JSON keys are strings; convert it yourself)"
    return None


def _needs_walk(value: Any, text: str) -> bool:
    """Whether the value's containers must be walked, decided from its JSON text where it can be (C-level
    counts): every dict writes one `{` and every list one `[` (strings may add more, never fewer), so
    with no `{` there is no key to check, with one `{` and a dict at the top only its own keys are left,
    and with at most MAX_DEPTH brackets in all the nesting cannot be too deep."""
    objects = text.count("{")
    if objects > 1 or objects + text.count("[") > MAX_DEPTH:
        return True
    if objects == 0:
        return False
    return not isinstance(value, dict) or not set(map(type, value)) <= _STR


def _fix_number(match: re.Match) -> str:
    number = match.group(1)
    if number is None:  # a string: unchanged
        return match.group(0)
    if number.startswith("-0.0"):
        return "0.0"
    return format(Decimal(number), "f") + ".0"
