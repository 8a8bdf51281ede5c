"""Keys: one data key per subject, wrapped by a master key; a bounded cache that `forget` evicts first.

Envelope encryption: a subject's fields are sealed with its own random 256-bit data key (AES-GCM);
the data key is stored (journal_datakey, the journal store's "personal data" section) only wrapped
by a master key. Master keys come from LOOM_KEYS as `id:base64` entries, the first one wrapping new
data keys; every stored data key names the id that wrapped it, so a new master is rotated in by
putting it first, running `manage.py loom_keys rotate` (rewraps the data keys: one row per subject,
no event rewritten), and removing the old entry afterwards. An external key service (a KMS) plugs
in through LOOM_KEY_SERVICE: a class with `wrap(key) -> (master_id, wrapped)` and
`unwrap(master_id, wrapped) -> key`, raising MasterKeyError when it cannot.

Correctness lives in the database: a read looks up the keys of its subjects there (one statement
per read, every subject of the batch at once), so a subject forgotten by another process is
forgotten here at once. The cache only saves unwrapping, and the write path's look-up: a writer
holding a key another process just destroyed seals with it, and what it writes is unreadable too.
"""

from __future__ import annotations

import base64
import binascii
import os
import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.db import transaction
from django.utils.module_loading import import_string

from journal import conf
from journal.exceptions import MasterKeyError

NONCE = 12


class KeyService(Protocol):
    """What wraps and unwraps data keys: LocalKeys (LOOM_KEYS), or an external service. One with
    `binds_subject = True` also takes `subject=` (wrap_for/unwrap_for): it binds the wrapped key to it."""

    def wrap(self, key: bytes) -> tuple[str, bytes]: ...

    def unwrap(self, master_id: str, wrapped: bytes) -> bytes: ...


def parse_keys(entries: Iterable[str]) -> list[tuple[str, bytes]]:
    """LOOM_KEYS entries as (id, 32-byte key), in order; ValueError saying which entry is wrong."""
    out, seen = [], set()
    for entry in entries:
        master_id, sep, text = str(entry).partition(":")
        if not sep or not master_id or len(master_id) > 64:
            raise ValueError("entries are id:base64 (an id of 1 to 64 characters, then a colon)")
        try:
            key = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"key {master_id!r} is not base64") from None
        if len(key) != 32:
            raise ValueError(f"key {master_id!r} is {len(key)} bytes, not 32 (AES-256)")
        if master_id in seen:
            raise ValueError(f"key id {master_id!r} appears twice")
        seen.add(master_id)
        out.append((master_id, key))
    return out


def keys_problem(entries: list) -> str | None:
    """The LOOM_KEYS setting check (loom.E001)."""
    try:
        parse_keys(entries)
    except ValueError as exc:
        return str(exc)
    return None


def new_master_key() -> str:
    """A fresh master key as LOOM_KEYS wants it after the id and colon (`manage.py loom_keys new`)."""
    return base64.b64encode(os.urandom(32)).decode()


class LocalKeys:
    """Master keys from LOOM_KEYS: AES-GCM wrapping, the wrapped key bound to its master id and its subject.

    A key wrapped for one subject does not unwrap for another (a wrapped key copied onto another subject's row
    is MasterKeyError, never that subject's key). Keys wrapped before this binding (60 bytes, bound to the
    master id only) still unwrap; `loom_keys rotate` to a new master id rewraps them bound."""

    binds_subject = True
    BOUND = b"\x02"  # first byte of a subject-bound wrapped key: BOUND + nonce + ciphertext and tag (61 bytes)

    def __init__(self, entries: Iterable[str]):
        try:
            self.keys = dict(parse_keys(entries))
        except ValueError as exc:
            raise MasterKeyError(f"LOOM_KEYS: {exc} (system check loom.E001)") from None
        self.current = next(iter(self.keys), None)

    def wrap(self, key: bytes, subject: str | None = None) -> tuple[str, bytes]:
        if self.current is None:
            raise MasterKeyError("LOOM_KEYS is empty: no master key to wrap a data key with (docs/privacy.md)")
        nonce = os.urandom(NONCE)
        sealed = nonce + AESGCM(self.keys[self.current]).encrypt(nonce, key, self._aad(self.current, subject))
        return self.current, sealed if subject is None else self.BOUND + sealed

    def unwrap(self, master_id: str, wrapped: bytes, subject: str | None = None) -> bytes:
        master = self.keys.get(master_id)
        if master is None:
            raise MasterKeyError(f"data keys are wrapped by master key {master_id!r}, which LOOM_KEYS does not hold")
        bound = len(wrapped) == 1 + NONCE + 48 and wrapped[:1] == self.BOUND
        if bound:
            if subject is None:
                raise MasterKeyError("a data key bound to its subject is unwrapped only with that subject's id")
            wrapped = wrapped[1:]
        try:
            return AESGCM(master).decrypt(wrapped[:NONCE], wrapped[NONCE:], self._aad(master_id,
                                                                                     subject if bound else None))
        except InvalidTag:
            raise MasterKeyError(f"master key {master_id!r} in LOOM_KEYS is not the key that wrapped the stored "
                                 "data key (wrong key, or a wrapped key moved onto another subject's row)") from None

    @staticmethod
    def _aad(master_id: str, subject: str | None) -> bytes:
        aad = b"loom-data-key:" + master_id.encode()
        return aad if subject is None else aad + b"\x00" + subject.encode()


def wrap_for(keys: KeyService, key: bytes, subject: str) -> tuple[str, bytes]:
    """Wrap `key` for `subject`: bound to it when the service binds (LocalKeys; an external service may set
    `binds_subject = True` and take `subject=`, its encryption context), else as the service wraps."""
    return keys.wrap(key, subject=subject) if getattr(keys, "binds_subject", False) else keys.wrap(key)


def unwrap_for(keys: KeyService, master_id: str, wrapped: bytes, subject: str) -> bytes:
    """Unwrap `subject`'s stored key (see wrap_for)."""
    if getattr(keys, "binds_subject", False):
        return keys.unwrap(master_id, wrapped, subject=subject)
    return keys.unwrap(master_id, wrapped)


_service: tuple[tuple, KeyService] | None = None


def service() -> KeyService:
    """The key service of the current settings (rebuilt when LOOM_KEYS or LOOM_KEY_SERVICE change)."""
    global _service
    entries, path = tuple(conf.get("LOOM_KEYS")), conf.get("LOOM_KEY_SERVICE")
    if _service is None or _service[0] != (entries, path):
        made = import_string(path)() if path else LocalKeys(entries)
        _service = ((entries, path), made)
    return _service[1]


class KeyCache:
    """A thread-safe LRU of unwrapped data keys by (database alias, subject): (wrapped text, AESGCM of the
    key); None = forgotten. The AESGCM object is kept, not the bytes: building it is part of every field's
    cost. The alias is part of the key: with LOOM_SHARDS each shard holds its own key of a subject (a key
    cached from one shard must never seal, nor a tombstone hide, another shard's data)."""

    def __init__(self):
        self._entries: OrderedDict[tuple[str | None, str], tuple[str | None, AESGCM | None]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, alias: str | None, subject: str) -> tuple[str | None, AESGCM | None] | None:
        with self._lock:
            got = self._entries.get((alias, subject))
            if got is not None:
                self._entries.move_to_end((alias, subject))
            return got

    def put(self, alias: str | None, subject: str, wrapped: str | None, key: AESGCM | None) -> None:
        size = conf.get("LOOM_KEY_CACHE_SIZE")
        with self._lock:
            self._entries[(alias, subject)] = (wrapped, key)
            self._entries.move_to_end((alias, subject))
            while len(self._entries) > size:
                self._entries.popitem(last=False)

    def evict(self, alias: str | None, subject: str) -> None:
        with self._lock:
            self._entries.pop((alias, subject), None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


cache = KeyCache()


def _unwrap(subject: str, row: tuple[str, str | None] | None, store=None) -> AESGCM | None:
    """The data key of a stored row (None: no row, or a forgotten subject), through the cache.

    Only committed rows are cached (with `store`: after its transaction commits): the write path trusts
    the cache, and a key whose creation is rolled back must not outlive its row."""
    if row is None or row[1] is None:
        _remember(store, subject, None, None)
        return None
    master_id, wrapped = row
    got = cache.get(_alias(store), subject)
    if got is not None and got[0] == wrapped:
        return got[1]
    key = AESGCM(unwrap_for(service(), master_id, base64.b64decode(wrapped), subject))
    _remember(store, subject, wrapped, key)
    return key


def _alias(store) -> str | None:
    return None if store is None else store.alias


def _remember(store, subject: str, wrapped: str | None, key: AESGCM | None) -> None:
    if store is None or not store.connection.in_atomic_block:
        cache.put(_alias(store), subject, wrapped, key)
    else:
        transaction.on_commit(lambda: cache.put(store.alias, subject, wrapped, key), using=store.alias)


def for_read(store, subjects: set[str], known: dict | None = None) -> dict[str, AESGCM | None]:
    """The data keys of `subjects` as the database holds them now: one statement for all of them.

    known: subject -> (master id, wrapped) of key rows the read's own statement brought with the events
    (PostgreSQL's READ_SEALED: the row of each event's first sealed subject); only the other subjects are
    looked up, all in one statement."""
    rows = known or {}
    rest = [s for s in subjects if s not in rows]
    if rest:
        rows = {**rows, **store.data_keys(sorted(rest))}
    return {s: _unwrap(s, rows.get(s), store) for s in subjects}


def for_write(store, subjects: set[str]) -> dict[str, AESGCM | None]:
    """The data keys to seal with (None: forgotten, seal nothing); new subjects get a key first.

    Cached keys need no statement; the others are read, and the missing ones created (insert if
    absent, then read back: two writers racing for a new subject both end up with the winner's)."""
    out: dict[str, AESGCM | None] = {}
    missing = set()
    for s in subjects:
        got = cache.get(store.alias, s)
        if got is None:
            missing.add(s)
        else:
            out[s] = got[1]
    if missing:
        rows = store.data_keys(sorted(missing))
        new = [s for s in sorted(missing) if s not in rows]
        mine: dict[str, tuple[str, bytes]] = {}
        if new:
            keys = service()
            made = []
            for s in new:
                key = AESGCM.generate_key(256)
                master_id, wrapped = wrap_for(keys, key, s)
                text = base64.b64encode(wrapped).decode()
                made.append((s, master_id, text))
                mine[s] = (text, key)
            store.create_data_keys(made)
            rows.update(store.data_keys(new))
        for s in missing:
            row = rows.get(s)
            if s in mine and row is not None and row[1] == mine[s][0]:  # ours won: no unwrap needed
                out[s] = AESGCM(mine[s][1])
                _remember(store, s, row[1], out[s])
            else:
                out[s] = _unwrap(s, row, store)
    return out


def rotate(store, batch: int = 500) -> int:
    """Rewrap every live data key not wrapped by the current master key; how many were rewrapped."""
    keys = service()
    current = keys.wrap(b"\0" * 32)[0]
    done = 0
    while rows := store.data_keys_to_rotate(current, batch):
        for subject, master_id, wrapped in rows:
            key = unwrap_for(keys, master_id, base64.b64decode(wrapped), subject)
            new_id, new_wrapped = wrap_for(keys, key, subject)
            done += store.rewrap_data_key(subject, wrapped, new_id, base64.b64encode(new_wrapped).decode())
    return done
