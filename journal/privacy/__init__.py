"""Personal data in an append-only log (docs/privacy.md): marking, sealing, forgetting, disclosure."""

from journal.privacy.codec import FORGOTTEN, WITHHELD, Reader
from journal.privacy.forget import AUDIT_STREAM, forget
from journal.privacy.marking import Blob, Sensitive, declare, declare_model, declare_step

__all__ = ["AUDIT_STREAM", "FORGOTTEN", "WITHHELD", "Blob", "Reader", "Sensitive", "declare", "declare_model",
           "declare_step", "forget"]


def reader_for_user(user) -> Reader:
    """The disclosure reader of a Django user: its username, its groups' names as roles, and the role
    `privacy` when it holds journal.disclose_personal_data (superusers hold every permission)."""
    roles = set(user.groups.values_list("name", flat=True)) if getattr(user, "pk", None) else set()
    if user.has_perm("journal.disclose_personal_data"):
        roles.add("privacy")
    return Reader(user.get_username() or None, frozenset(roles))
