"""Shards: which database alias holds a stream, and the router that sends every statement of a stream there.

One function picks the alias of a stream, `shard_for(stream_id)`; every public entry point that names
a stream (the journal's managers, flows' start/resume/describe/cancel/retry, aggregates' load/do,
leases, recovery, projections) runs its work inside `bound(alias)` (or `on_stream(stream_id)`), and
everything below it — `Event.objects.db`, `store_for()`, the lease keeper, the coalescer — follows
that binding through `ShardRouter` and `current()`. A new operation on a stream (timers, queues...)
adopts sharding by wrapping its entry point in `on_stream(stream_id)`: docs/architecture.md "Shards".

Placement is a stable hash (BLAKE2b, never Python's salted `hash()`) of the stream's partition key —
the whole id, or what `LOOM_SHARD_KEY` derives from it, so a tenant's streams live together — modulo
the number of shards. Adding a shard never moves a stream: the earlier shard counts are declared in
`LOOM_SHARD_HISTORY`, and a stream that already exists is found where the count of its time placed it
(one probe per earlier placement, remembered once found: a placement never changes). docs/scaling.md.

Nothing is atomic across shards: one statement or one transaction touches one database.
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import re
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from threading import Lock

from django.conf import settings
from django.core.signals import setting_changed
from django.db import DEFAULT_DB_ALIAS, InterfaceError, OperationalError
from django.utils.module_loading import import_string

from journal import conf
from journal.reach import cannot_reach

# The apps whose tables live on every shard (a shard alias migrates only these). A queue entry lives on
# its execution's shard: the dequeue reads the execution's header in the same statement (queues/store).
SHARDED_APPS = frozenset({"journal", "leases", "projections", "queues"})
# Models of those apps that stay with the main database: the start reservation commits with django-q2's
# ORM queue row (leases/tasks.py), which is not sharded; a cron schedule names no stream (its ticks'
# executions are placed by their ids), so its rows are claimed on one database (leases/schedules.py).
UNSHARDED_MODELS = frozenset({"leases.startreservation", "leases.schedule"})

_current: contextvars.ContextVar[str | None] = contextvars.ContextVar("loom_shard", default=None)
_found: OrderedDict[str, str] = OrderedDict()  # stream -> alias, for streams found under an earlier count
_found_lock = Lock()
FOUND_CACHE = 100_000


_cached: dict[str, object] = {}  # parsed settings; cleared when a setting changes (override_settings, tests)
WATCHED = frozenset({"LOOM_SHARDS", "LOOM_SHARD_HISTORY", "LOOM_SHARD_KEY", "DATABASE_ROUTERS", "DATABASES"})


def _forget_settings(*, setting: str, **kwargs) -> None:
    if setting in WATCHED:
        _cached.clear()


setting_changed.connect(_forget_settings, dispatch_uid="journal.shards")


def _setting(name: str, parse: Callable[[], object]) -> object:
    """A setting's parsed value, parsed once: the placement runs on every journal call, so it must not re-read,
    re-coerce or re-import on each (a few microseconds per append otherwise). Settings change only at start-up
    or through override_settings, whose signal clears this."""
    try:
        return _cached[name]
    except KeyError:
        value = _cached[name] = parse()
        return value


def shards() -> list[str]:
    """The shard aliases, in placement order: LOOM_SHARDS, or the one database the routers give the journal
    (the default database without a router of the project's own)."""
    return list(_setting("shards", _aliases))


def _aliases() -> tuple[str, ...]:
    configured = conf.get("LOOM_SHARDS")
    if configured:
        return tuple(configured)
    from django.db import router

    from journal.models import Event

    for each in router.routers:  # the project's own routers, never ours (it would answer the bound shard)
        if not isinstance(each, ShardRouter) and hasattr(each, "db_for_write"):
            alias = each.db_for_write(Event)
            if alias:
                return (alias,)
    return (DEFAULT_DB_ALIAS,)


def sharded() -> bool:
    """More than one shard is configured."""
    return len(shards()) > 1


def home() -> str:
    """The alias of work that names no stream (a default for store_for() outside any binding): the first shard."""
    return _current.get() or shards()[0]


def current() -> str | None:
    """The alias bound by the innermost `bound()` of this thread or task, or None."""
    return _current.get()


def key_function() -> Callable[[str], str]:
    """LOOM_SHARD_KEY's function (imported once per value), or the whole id."""

    def parse() -> Callable[[str], str]:
        path = conf.get("LOOM_SHARD_KEY")
        return import_string(path) if path else _whole

    return _setting("LOOM_SHARD_KEY", parse)


def _whole(stream_id: str) -> str:
    return stream_id


def prefix_key(stream_id: str) -> str:
    """A partition key for ids shaped `<tenant>/<rest>` (or `<tenant>:<rest>`): everything before the first
    `/` or `:`; an id with neither is its own key. LOOM_SHARD_KEY = "journal.shards.prefix_key"."""
    for i, ch in enumerate(stream_id):
        if ch in "/:":
            return stream_id[:i]
    return stream_id


def slot(key: str, count: int) -> int:
    """The placement of a partition key among `count` shards: stable across processes, hosts and versions."""
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % count


_FAMILY = re.compile(r"(?:~\d+|\.child-\d+)+\Z")


def family(stream_id: str) -> str:
    """The id a stream is placed by: itself, or for the runs of a continue_as_new chain (`<root>~<n>`) and
    default child ids (`<parent>.child-<pos>`, nested too) their root, so that a chain's message carry and
    a child's wake of its parent are statements on one shard (journal/flows/waits.py)."""
    if "~" not in stream_id and ".child-" not in stream_id:
        return stream_id
    return _FAMILY.sub("", stream_id) or stream_id


def placements(stream_id: str) -> list[str]:
    """Where the stream may live, newest placement first: under the current shard count, then under each
    earlier count of LOOM_SHARD_HISTORY (newest first), without repeats."""
    aliases = shards()
    if len(aliases) == 1:
        return aliases
    key = key_function()(family(stream_id))
    history = _setting("LOOM_SHARD_HISTORY", lambda: tuple(int(n) for n in conf.get("LOOM_SHARD_HISTORY")))
    counts = [len(aliases), *reversed(history)]
    found: list[str] = []
    for count in counts:
        alias = aliases[slot(key, count)]
        if alias not in found:
            found.append(alias)
    return found


def shard_for(stream_id: str) -> str:
    """THE alias of a stream: where it lives, or for a new stream where it will be created.

    With no LOOM_SHARD_HISTORY this is the hash placement and reads nothing. After shards were added, a
    stream whose current placement differs from an earlier one is looked up: the first placement whose
    shard has the stream wins (remembered: placements never change); if none has it, it is new and goes
    to the current placement. An id that exists under an earlier placement therefore stays there, and a
    second start or open of it is refused there (StreamExists) instead of creating a twin."""
    aliases = _setting("shards", _aliases)
    if len(aliases) == 1:  # one database: no placement to compute, no list to copy (every append asks)
        return aliases[0]
    candidates = placements(stream_id)
    if len(candidates) == 1:
        return candidates[0]
    with _found_lock:
        known = _found.get(stream_id)
        if known is not None:
            _found.move_to_end(stream_id)
            return known
    from journal.store import store_for

    for alias in candidates:
        if store_for(alias).tip(stream_id) >= 0:
            with _found_lock:  # found: its placement never changes, so later calls skip the probes
                _found[stream_id] = alias
                while len(_found) > FOUND_CACHE:
                    _found.popitem(last=False)
            return alias
    return candidates[0]  # new (not remembered: it may yet be created elsewhere by a process on an old list)


def shard_of_key(key: str) -> str:
    """The shard of a partition key that is not a stream id (a queue's partition, a dedup id): where a new
    stream whose key is `key` would be placed now. Queues place an entry's minted id by it (mint_on)."""
    aliases = shards()
    return aliases[0] if len(aliases) == 1 else aliases[slot(key_function()(key), len(aliases))]


MINT_TRIES = 64


def mint_on(alias: str, mint: Callable[[], str]) -> str:
    """A new id from `mint` that is placed on `alias` (a few draws: each lands on a shard at random), so
    that what must be counted together (a queue partition's entries) lives on one shard. A key function
    that maps every minted id to one shard cannot be met: the last draw is returned (placed elsewhere)."""
    candidate = mint()
    for _ in range(MINT_TRIES):
        if placements(candidate)[0] == alias:
            return candidate
        candidate = mint()
    return candidate


def forget() -> None:
    """Drop remembered placements (tests that change the shard settings)."""
    with _found_lock:
        _found.clear()


@contextmanager
def bound(alias: str) -> Iterator[str]:
    """Run the block on `alias`: the router sends the sharded apps' ORM queries there, and store_for(),
    the lease ownership and the coalescer take it as their database."""
    token = _current.set(alias)
    try:
        yield alias
    finally:
        _current.reset(token)


@contextmanager
def on_stream(stream_id: str) -> Iterator[str]:
    """`bound(shard_for(stream_id))`: THE seam of an entry point that operates on one stream."""
    with bound(shard_for(stream_id)) as alias:
        yield alias


def by_stream(fn: Callable) -> Callable:
    """Decorate an entry point whose first argument is a stream (execution) id: the call runs on that
    stream's shard. An argument that is not a str is passed through unbound (the function refuses it)."""

    @functools.wraps(fn)
    def wrapper(stream_id, *args, **kwargs):
        if not isinstance(stream_id, str) or not stream_id or "\x00" in stream_id:
            return fn(stream_id, *args, **kwargs)
        with on_stream(stream_id):
            return fn(stream_id, *args, **kwargs)

    return wrapper


class ShardRouter:
    """Sends the sharded apps' models to the bound shard, and migrates only their tables on a shard alias.

    DATABASE_ROUTERS = ["journal.shards.ShardRouter", ...] whenever LOOM_SHARDS names more than one alias
    (system check loom.E021). Outside any binding it has no opinion (the next router, or the default)."""

    @staticmethod
    def routes(model) -> bool:
        """The model lives on every shard (its app is sharded and it is not one of the exceptions)."""
        return model._meta.app_label in SHARDED_APPS and model._meta.label_lower not in UNSHARDED_MODELS

    def db_for_read(self, model, **hints) -> str | None:
        return _current.get() if self.routes(model) else None

    db_for_write = db_for_read

    def allow_relation(self, obj1, obj2, **hints) -> bool | None:
        return None

    def allow_migrate(self, db: str, app_label: str, model_name: str | None = None, **hints) -> bool | None:
        if db == DEFAULT_DB_ALIAS or db not in shards():
            return None
        if app_label not in SHARDED_APPS:
            return False
        return model_name is None or f"{app_label}.{model_name}" not in UNSHARDED_MODELS


def split(stream_ids: list[str]) -> dict[str, list[int]]:
    """Positions of the ids on each shard, shards in placement order (a batch's statements per shard)."""
    groups: dict[str, list[int]] = {}
    for i, stream_id in enumerate(stream_ids):
        groups.setdefault(shard_for(stream_id), []).append(i)
    order = {alias: n for n, alias in enumerate(shards())}
    return dict(sorted(groups.items(), key=lambda kv: order.get(kv[0], len(order))))


def append_per_shard(items: list) -> list:
    """`append_batch` over several shards: one statement per shard, each all or nothing. A refusal on a
    shard does not stop the others; it raises BatchRefused when nothing was written anywhere, else
    ShardsPartlyWritten naming what was written."""
    from journal.exceptions import AppendRefused, BatchRefused, InvalidPayload, ShardsPartlyWritten
    from journal.store import store_for

    ids = [item.stream_id for item in items]
    if len(set(ids)) < len(ids):
        twice = next(i for n, i in enumerate(ids) if i in ids[:n])
        raise InvalidPayload(f"stream {twice} appears twice in one batch; merge its envelopes")
    groups = split(ids)
    encoded: list = [None] * len(items)
    for alias, positions in groups.items():  # every payload checked (and sealed) before any shard is written
        # each shard's store seals its part: a subject's data key lives on the shard of its events
        for i, texts in zip(positions, store_for(alias).encode([items[i] for i in positions]), strict=True):
            encoded[i] = texts
    results: list = [None] * len(items)
    errors: dict = {}
    for alias, positions in groups.items():
        try:
            written = store_for(alias).append_encoded([items[i] for i in positions], [encoded[i] for i in positions])
        except BatchRefused as exc:
            errors.update(exc.errors)
            continue
        except AppendRefused as exc:  # a shard's part of one stream: its own refusal
            errors.update({stream: exc for stream in exc.streams})
            continue
        for i, appended in zip(positions, written, strict=True):
            results[i] = appended
    if not errors:
        return results
    appended = {items[i].stream_id: r for i, r in enumerate(results) if r is not None}
    if appended:
        raise ShardsPartlyWritten(errors, appended)
    raise BatchRefused(errors)


def configuration_problems() -> list[str]:
    """What is wrong with the shard configuration (system check loom.E020/E021)."""
    problems = []
    try:
        aliases = shards()
        history = [int(n) for n in conf.get("LOOM_SHARD_HISTORY")]
    except (ValueError, TypeError) as exc:
        return [f"LOOM_SHARDS/LOOM_SHARD_HISTORY: {exc}"]
    for alias in aliases:
        if alias not in settings.DATABASES:
            problems.append(f"LOOM_SHARDS names {alias!r}, which is not in DATABASES")
    if len(set(aliases)) != len(aliases):
        problems.append("LOOM_SHARDS names an alias twice")
    if any(not 1 <= n < len(aliases) for n in history) or history != sorted(history):
        problems.append(f"LOOM_SHARD_HISTORY={history} must list earlier shard counts, ascending, each below "
                        f"the current {len(aliases)}")
    return problems


def router_installed() -> bool:
    for router in getattr(settings, "DATABASE_ROUTERS", []):
        cls = router if isinstance(router, type) else type(router)
        if isinstance(router, str):
            try:
                cls = import_string(router)
            except ImportError:
                continue
        if issubclass(cls, ShardRouter):
            return True
    return False


def read_each(aliases: list[str], read: Callable[[str], object], unreachable: dict[str, str] | None = None) -> list:
    """`read(alias)` on each alias, the answers in order. Given `unreachable` (a page that shows what it can), an
    alias whose server cannot be reached (journal.reach.cannot_reach) is left out and named there (alias -> the
    error's first line); without it, and for a statement the server refused, the error is raised."""
    found = []
    for alias in aliases:
        try:
            found.append(read(alias))
        except (OperationalError, InterfaceError) as error:
            if unreachable is None or not cannot_reach(error):
                raise
            unreachable[alias] = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return found
