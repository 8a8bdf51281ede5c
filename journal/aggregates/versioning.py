"""Event versioning by name: `Opened`, `Opened_v2`, `Opened_v3` are versions 1, 2, 3 of one event.

The highest declared version of a name is current; every older one is deprecated. Emitting a
deprecated version still works (old code keeps running) but logs a warning once per event name
per process, on the logger `journal.aggregates.versioning`. We log instead of `warnings.warn`
because the signal is for operators reading logs, not for the test runner (which turns warnings
into errors), and because "once per process" must not depend on the warnings filter state.

Reading an old version can be upcast: a declared function turns the old payload into the payload
of the next version, repeatedly, until a version with a patch is reached.

Cost when nothing is deprecated: the runtime tests one empty frozenset per emitted event.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable
from itertools import pairwise

logger = logging.getLogger("journal.aggregates.versioning")

VERSIONED = re.compile(r"^(?P<base>.+)_v(?P<n>[0-9]+)$")

_warned: set[tuple[str, str]] = set()  # (state, event name)
_warned_lock = threading.Lock()


def split(name: str) -> tuple[str, int]:
    """`Opened_v3` -> ("Opened", 3); a name without suffix is version 1."""
    match = VERSIONED.match(name)
    if match is None:
        return name, 1
    return match.group("base"), int(match.group("n"))


def plan(names: Iterable[str]) -> tuple[frozenset[str], dict[str, str]]:
    """The deprecated names among `names`, and for each one the name of its next declared version."""
    families: dict[str, list[tuple[int, str]]] = {}
    for name in names:
        base, n = split(name)
        families.setdefault(base, []).append((n, name))
    deprecated: set[str] = set()
    successor: dict[str, str] = {}
    for versions in families.values():
        versions.sort()
        for (_, older), (_, newer) in pairwise(versions):
            deprecated.add(older)
            successor[older] = newer
    return frozenset(deprecated), successor


def warn_deprecated(state: str, name: str, current: str) -> None:
    """Log that `name` is deprecated, the first time this process emits it (then never again)."""
    key = (state, name)
    if key in _warned:  # the steady state: one set lookup, no lock
        return
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    logger.warning("state %s emitted deprecated event %s; %s is its current version", state, name, current)


def reset_warnings() -> None:
    """Forget which names were warned about (for tests)."""
    with _warned_lock:
        _warned.clear()
