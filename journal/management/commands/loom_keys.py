"""`manage.py loom_keys new|rotate|forget`: master keys and data subjects (docs/privacy.md)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from journal import shards
from journal.exceptions import PrivacyError
from journal.privacy import forget, keys
from journal.store import store_for


class Command(BaseCommand):
    help = ("new: print a fresh master key entry for LOOM_KEYS. rotate: rewrap every data key with the first "
            "LOOM_KEYS entry (no event is rewritten). forget SUBJECT --by WHO: destroy a subject's key.")

    def add_arguments(self, parser) -> None:
        parser.add_argument("action", choices=["new", "rotate", "forget"])
        parser.add_argument("subject", nargs="?", help="forget: the data subject's id")
        parser.add_argument("--id", default="k1", help="new: the key id to print (default k1)")
        parser.add_argument("--by", help="forget: who asked (recorded in the audit event)")
        parser.add_argument("--database", default=None,
                            help="Database alias (default: the default database; with LOOM_SHARDS every shard).")

    def handle(self, *args, action: str, subject: str | None, id: str, by: str | None, database: str | None,
               **options) -> None:
        try:
            if action == "new":
                self.stdout.write(f"{id}:{keys.new_master_key()}")
            elif action == "rotate":
                done = sum(keys.rotate(store_for(alias)) for alias in ([database] if database else shards.shards()))
                self.stdout.write(f"rewrapped {done} data key(s) with master key {keys.service().wrap(bytes(32))[0]}")
            else:
                if not subject or not by:
                    raise CommandError("forget needs a SUBJECT and --by WHO")
                forget(subject, by=by, alias=database)
                self.stdout.write(f"forgot {subject}")
        except PrivacyError as exc:
            raise CommandError(str(exc)) from None
