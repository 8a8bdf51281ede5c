"""Crypto-shredding: forget a data subject by destroying its data key; the log is not touched.

`forget(subject, by=...)` writes a constant number of rows whatever the number of events: the
subject's key row (overwritten to a tombstone), the deleted links of its blobs, and one audit event
(`SubjectForgotten {subject, by}` on the stream AUDIT_STREAM) in the same transaction. The caches are
evicted first and again after the commit, and the subject's blobs are erased from the content store
once the forget is committed. Every read afterwards shows FORGOTTEN for the subject's fields.
"""

from __future__ import annotations

from django.db import transaction

from journal.envelopes import Envelope
from journal.exceptions import InvalidPayload, SequenceConflict
from journal.privacy import keys

AUDIT_STREAM = "loom.privacy.audit"
FORGOTTEN_EVENT = "SubjectForgotten"


def forget(subject: str, *, by: str, alias: str = "default") -> None:
    """Destroy `subject`'s data key (idempotent); `by` names who asked, for the audit event."""
    from journal.models import Event
    from journal.privacy import content
    from journal.store import store_for

    if not isinstance(subject, str) or not subject or len(subject) > 200 or "\x00" in subject:
        raise InvalidPayload(f"a subject id is a non-empty string of at most 200 characters, got {subject!r}")
    if not isinstance(by, str) or not by:
        raise InvalidPayload("forget(subject, by=...) names who asked (the audit event records it)")
    store = store_for(alias)
    keys.cache.evict(subject)
    with transaction.atomic(using=alias):
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
        keys.cache.put(subject, None, None)
        if erase:
            content.store().delete(erase)

    transaction.on_commit(after_commit, using=alias)
