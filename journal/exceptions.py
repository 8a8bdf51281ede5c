"""The journal's errors. Database errors are translated into these at the store boundary.

Every error raised by an append guarantees that nothing of the failed call was stored, except
DatabaseUnavailable: the server went away under the statement, so the commit is in doubt (retry with the
same guards to decide).
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import OperationalError


class JournalError(Exception):
    """Base class of every error the journal raises."""


class InvalidPayload(JournalError, ValueError):
    """An envelope is not storable: bad type name, payload not JSON-serialisable, or too large."""


class InvalidGuard(InvalidPayload):
    """A fence token or expected seq is not an integer in the range a bigint column holds."""


class InvalidStream(JournalError, ValueError):
    """A stream id is not in the id alphabet (journal/ids.py): empty, too long, whitespace, control,
    format or surrogate characters, or a '.' / '..' path segment."""


class AppendRefused(JournalError):
    """An append's guard failed for one or more streams; nothing of the call was written."""

    def __init__(self, message: str, streams: Iterable[str]):
        self.streams = tuple(streams)
        super().__init__(message)


class DatabaseUnavailable(JournalError, OperationalError):
    """A write could not be completed because the database could not be reached (down, restarting, failing
    over to its standby: journal/reach.py). Retryable, and in doubt: the commit may have been stored before the
    connection broke. Retry with the same guards (expected seq, fence token): the guard refuses a second copy
    (SequenceConflict, StaleFence), so a retry never applies twice. An OperationalError too, so that code
    catching the driver's error still catches it."""


class StaleFence(AppendRefused):
    """The writer's fence token is not the stream's current one: another owner took over."""


class SequenceConflict(AppendRefused):
    """The stream's tip is not where the writer expected: another writer appended first."""


class UnknownStream(AppendRefused):
    """The stream does not exist (no fence and no events)."""


class StreamExists(AppendRefused):
    """The stream was already opened: its sequence 0 exists."""


class BatchRefused(AppendRefused):
    """A batch append was refused; `.errors` holds the guard error of each stream at fault."""

    def __init__(self, errors: dict[str, AppendRefused]):
        self.errors = errors
        detail = "; ".join(f"{stream}: {type(err).__name__}" for stream, err in errors.items())
        super().__init__(f"batch refused, nothing written ({detail})", errors)


class ShardsPartlyWritten(BatchRefused):
    """A batch over several shards was refused on some of them and written on others: each shard's part is
    all or nothing, the batch as a whole is not (one statement per shard; docs/scaling.md). `.errors` holds
    the refused streams' errors, `.appended` the Appended of each stream that WAS written."""

    def __init__(self, errors: dict[str, AppendRefused], appended: dict):
        super().__init__(errors)
        self.appended = appended
        self.args = (f"batch refused on some shards, written on others: refused {sorted(errors)}, "
                     f"written {sorted(appended)}", errors)


ConcurrencyError = SequenceConflict
"""Optimistic-concurrency failure as aggregates name it: another commit won the race."""


# -- personal data (journal/privacy) -----------------------------------------------------------------


class PrivacyError(JournalError):
    """Base class of the errors of sensitive fields, keys and the content store (docs/privacy.md)."""


class MasterKeyError(PrivacyError):
    """A data key cannot be unwrapped: its master key id is missing from LOOM_KEYS, or the key given under
    that id is not the one that wrapped it (system check loom.E031 reports this at start-up)."""


class TamperedCiphertext(PrivacyError):
    """An encrypted field failed its AES-GCM authentication: the stored ciphertext (or the subject or
    field it is bound to) was changed after it was written."""


class SealDowngraded(TamperedCiphertext):
    """A stored event holds in clear a field its type marks as sensitive, not named by its "$sealed" header:
    the header was edited to downgrade the field (or the event was written before the field was marked)."""


class ForgottenData(PrivacyError):
    """A state needs a field whose data subject was forgotten, and its schema asks for an error
    (`Sensitive(..., forgotten="error")`) rather than the marker."""


class ContentMissing(PrivacyError):
    """An event refers to content (SHA-256) that the content store no longer holds, or holds changed."""


class ForgetIncomplete(PrivacyError):
    """A forget over several shards was done on some and not on others: the subject's key is tombstoned on
    the shards in `.forgotten` and still held on those in `.failed` (alias -> the error's first line), whose
    copy of its data stays readable until the forget is run again (it is idempotent) once they answer."""

    def __init__(self, subject: str, forgotten: list[str], failed: dict[str, str]):
        self.subject, self.forgotten, self.failed = subject, list(forgotten), dict(failed)
        done = ", ".join(self.forgotten) or "none"
        why = "; ".join(f"{alias}: {reason}" for alias, reason in self.failed.items())
        super().__init__(f"forget({subject!r}) is incomplete: not done on shard(s) {', '.join(self.failed)} "
                         f"({why}), where its key is still held; done on {done}. Forget again once they are "
                         "back (it is idempotent).")
