"""Crypto-shredding: forget a data subject by destroying its data key; the log is not touched.

`forget(subject, by=...)` writes a constant number of rows whatever the number of events: the
subject's key row (overwritten to a tombstone), the deleted links of its blobs, and one audit event
(`SubjectForgotten {subject, by}` on the stream AUDIT_STREAM) in the same transaction. The caches are
evicted first and again after the commit, and the subject's blobs are erased from the content store
once the forget is committed. Every read afterwards shows FORGOTTEN for the subject's fields.

With LOOM_SHARDS a subject has a data key on each shard where its data was sealed; `forget` tombstones it
on every shard (one transaction and one audit event on each: nothing is atomic across shards); a shard that
cannot be reached leaves the others forgotten and raises ForgetIncomplete naming it.
"""

from __future__ import annotations

from django.db import transaction

from journal.atomic import atomic
from journal.envelopes import Envelope
from journal.exceptions import ForgetIncomplete, InvalidPayload, SequenceConflict
from journal.privacy import keys

AUDIT_STREAM = "loom.privacy.audit"
FORGOTTEN_EVENT = "SubjectForgotten"


def forget(subject: str, *, by: str, alias: str | None = None) -> None:
    """Destroy `subject`'s data key (idempotent); `by` names who asked, for the audit event.

    Without `alias`, on every shard (journal/shards.py; one database unsharded): data keys live on the shard
    of the events they seal (a read joins them in its statement), so each shard holds its own key of a
    subject, and each gets the tombstone, so that no shard later makes a new key for a forgotten subject.
    Each shard's forget is its own transaction with its own audit event. Every shard's cached key of the
    subject is evicted before any shard is tried, so that none is served from this process's cache whatever
    fails. A shard that fails (down, refusing connections) does not stop the others: they are all tried, and
    ForgetIncomplete then names the shards done and those not done (its cause is the first shard's error);
    forget again once they are back, it is idempotent."""
    from django.db import DatabaseError

    from journal import shards

    if not isinstance(subject, str) or not subject or len(subject) > 200 or "\x00" in subject:
        raise InvalidPayload(f"a subject id is a non-empty string of at most 200 characters, got {subject!r}")
    if not isinstance(by, str) or not by:
        raise InvalidPayload("forget(subject, by=...) names who asked (the audit event records it)")
    aliases = [alias] if alias is not None else shards.shards()
    for one in aliases:
        keys.cache.evict(one, subject)
    if len(aliases) == 1:
        _forget_on(aliases[0], subject, by)
        return
    done: list[str] = []
    failed: dict[str, BaseException] = {}
    for one in aliases:
        try:
            _forget_on(one, subject, by)
        except (DatabaseError, SequenceConflict) as exc:  # this shard's transaction rolled back: nothing of it
            failed[one] = exc
        else:
            done.append(one)
    if failed:
        raise ForgetIncomplete(subject, done, {a: _first_line(e) for a, e in failed.items()}) from next(
            iter(failed.values()))


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _forget_on(alias: str, subject: str, by: str) -> None:
    """One database's forget: its key row to a tombstone, its blobs unlinked, its audit event, one transaction."""
    from journal.models import Event
    from journal.privacy import content
    from journal.store import store_for

    store = store_for(alias)
    keys.cache.evict(alias, subject)
    with atomic(alias):
        erase = store.forget_subject(subject, by)
        for attempt in range(20):  # the audit stream is shared: a concurrent forget may take our seq
            try:
                Event.objects.db_manager(alias).append(
                    AUDIT_STREAM, [Envelope(FORGOTTEN_EVENT, {"subject": subject, "by": by[:200]})])
                break
            except SequenceConflict:
                if attempt == 19:
                    raise

    def after_commit() -> None:  # a forget rolled back with its caller's transaction forgets nothing
        keys.cache.put(alias, subject, None, None)
        if erase:
            content.store().delete(erase)

    transaction.on_commit(after_commit, using=alias)
