"""The content store: payloads and blob fields kept outside journal_event, addressed by SHA-256.

Content goes through Django's storage API: the storage named LOOM_CONTENT_STORAGE in settings.STORAGES
(any django-storages backend), or a FileSystemStorage under LOOM_CONTENT_DIR. Names are
`<first two hex digits>/<sha256>`, so equal content is stored once. Reads resolve every reference of a
batch in one `get_many` call (a backend with a batch read may override it); what comes back is checked
against its hash (ContentMissing otherwise). A bounded LRU caches content, which never changes under its
name; `delete` evicts it from the cache before it deletes the file, so erased content is never served
again from memory.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path

from django.core.files.base import ContentFile
from django.core.files.storage import FileSystemStorage, Storage, storages

from journal import conf
from journal.exceptions import ContentMissing

HEX = re.compile(r"[0-9a-f]{64}")
"""A content reference: a SHA-256 in lower-case hex (never a path of the storage's choosing)."""


class ContentStore:
    """Content-addressed bytes over one Django storage; `batches` counts get_many calls (benchmarks)."""

    def __init__(self, storage: Storage):
        self.storage = storage
        self._cache: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()
        self.batches = 0

    @staticmethod
    def name(sha: str) -> str:
        return f"{sha[:2]}/{sha}"

    def put(self, data: bytes) -> str:
        """Store `data` (once: equal content shares one file); its SHA-256 in hex."""
        sha = hashlib.sha256(data).hexdigest()
        name = self.name(sha)
        if not self.storage.exists(name):
            self.storage.save(name, ContentFile(data))
        return sha

    def get_many(self, shas: Iterable[str]) -> dict[str, str]:
        """The text of every reference, in one call; ContentMissing names the first one absent or changed."""
        self.batches += 1
        out: dict[str, str] = {}
        for sha in set(shas):
            if not isinstance(sha, str) or not HEX.fullmatch(sha):
                raise ContentMissing(f"not a content reference: {sha!r}")
            with self._lock:
                text = self._cache.get(sha)
                if text is not None:
                    self._cache.move_to_end(sha)
            if text is None:
                text = self._load(sha)
                self._remember(sha, text)
            out[sha] = text
        return out

    def _load(self, sha: str) -> str:
        try:
            with self.storage.open(self.name(sha), "rb") as handle:
                data = handle.read()
        except (FileNotFoundError, OSError):
            raise ContentMissing(f"content {sha} is not in the content store (erased, or never stored)") from None
        if hashlib.sha256(data).hexdigest() != sha:
            raise ContentMissing(f"content {sha} in the content store does not match its hash (changed)")
        return data.decode("utf-8")

    def _remember(self, sha: str, text: str) -> None:
        size = conf.get("LOOM_CONTENT_CACHE_SIZE")
        with self._lock:
            self._cache[sha] = text
            while len(self._cache) > size:
                self._cache.popitem(last=False)

    def delete(self, shas: Iterable[str]) -> None:
        """Erase content: out of the cache first, then out of the storage."""
        shas = list(shas)
        with self._lock:
            for sha in shas:
                self._cache.pop(sha, None)
        for sha in shas:
            self.storage.delete(self.name(sha))

    def exists(self, sha: str) -> bool:
        return self.storage.exists(self.name(sha))


_store: tuple[tuple, ContentStore] | None = None
_lock = threading.Lock()


def directory() -> str:
    """The default store's directory: LOOM_CONTENT_DIR, or when empty <BASE_DIR>/var/loom-content (else
    <MEDIA_ROOT>/loom-content). Absolute, so a web server, a worker and a cron job started from different
    working directories share one store (a relative LOOM_CONTENT_DIR is loom.W032; without BASE_DIR and
    MEDIA_ROOT the default is relative too, and warned about the same way)."""
    from django.conf import settings

    chosen = conf.get("LOOM_CONTENT_DIR")
    if chosen:
        return chosen
    base = getattr(settings, "BASE_DIR", None)
    if base:
        return str(Path(base) / "var" / "loom-content")
    media = getattr(settings, "MEDIA_ROOT", "")
    return str(Path(media) / "loom-content") if media else "var/loom-content"


def store() -> ContentStore:
    """The content store of the current settings (made once per LOOM_CONTENT_STORAGE / LOOM_CONTENT_DIR)."""
    global _store
    wanted = (conf.get("LOOM_CONTENT_STORAGE"), directory())
    with _lock:
        if _store is None or _store[0] != wanted:
            alias, location = wanted
            _store = (wanted, ContentStore(storages[alias] if alias else FileSystemStorage(location=location)))
        return _store[1]
