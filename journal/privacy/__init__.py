"""Personal data in an append-only log (docs/privacy.md): marking, sealing, forgetting, disclosure."""

from journal.privacy.codec import FORGOTTEN, WITHHELD, Reader
from journal.privacy.forget import AUDIT_STREAM, forget
from journal.privacy.marking import Blob, Sensitive, declare, declare_model, declare_step

__all__ = ["AUDIT_STREAM", "FORGOTTEN", "WITHHELD", "Blob", "Reader", "Sensitive", "declare", "declare_model",
           "declare_step", "forget"]


def reader_for_user(user) -> Reader:
    """The disclosure reader of a Django user (the admin). It owns no subject (id None: a username equal to a
    subject id must not disclose that subject's data). Its roles: `privacy` when it holds the permission
    journal.disclose_personal_data (superusers hold every permission), and the roles LOOM_DISCLOSE_GROUPS
    maps its groups to; a group's name alone grants nothing (a pre-existing group called "privacy" is not a role)."""
    from journal import conf

    roles: set[str] = set()
    mapping = [entry.rsplit(":", 1) for entry in conf.get("LOOM_DISCLOSE_GROUPS")]
    if mapping and getattr(user, "pk", None):
        groups = set(user.groups.values_list("name", flat=True))
        roles.update(role for group, role in mapping if group in groups)
    if user.has_perm("journal.disclose_personal_data"):
        roles.add("privacy")
    return Reader(None, frozenset(roles))
