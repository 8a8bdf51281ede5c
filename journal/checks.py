"""System checks: misconfiguration is reported at start-up with an id, not inside a worker."""

from __future__ import annotations

import functools
from base64 import b64decode
from collections.abc import Callable

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register
from django.db import connections

from journal import conf

# The library apps' check ids are one namespace, `loom.`, with a range of numbers per app (journal 001-099,
# leases 100-199, loomapi 200-299, queues 300-399, projections 400-499; docs/configuration.md "System checks").
# Ids that had another name before are listed here by their app (renamed()): a project that still silences a
# former id in SILENCED_SYSTEM_CHECKS keeps it silenced for one more release (until 0.3), and loom.W002 tells it
# which id to name instead, so a rename never turns into a message nobody was told about.
FORMER_IDS: dict[str, tuple[str, ...]] = {}  # id -> the ids it had before


def renamed(former: dict[str, tuple[str, ...]]) -> None:
    """Declare an app's renamed check ids (called when its checks module is imported)."""
    FORMER_IDS.update(former)


def honour_former_ids(messages: list) -> list:
    """The messages, less those whose former id is still silenced (Django filters the current ids itself)."""
    silenced = set(getattr(settings, "SILENCED_SYSTEM_CHECKS", ()))
    return [message for message in messages if not silenced.intersection(FORMER_IDS.get(message.id, ()))]


def honouring_former_ids(check: Callable[..., list]) -> Callable[..., list]:
    """A check function whose messages leave out those a silenced former id still silences."""

    @functools.wraps(check)
    def honoured(*args, **kwargs) -> list:
        return honour_former_ids(check(*args, **kwargs))

    return honoured


@register()
def check_former_ids_silenced(app_configs=None, **kwargs) -> list:
    """loom.W002: SILENCED_SYSTEM_CHECKS names a check id that was renamed; it is honoured until 0.3."""
    silenced = set(getattr(settings, "SILENCED_SYSTEM_CHECKS", ()))
    return [Warning(f"SILENCED_SYSTEM_CHECKS names {old!r}, the former id of {new!r}: it is still honoured, "
                    "until Loom 0.3", hint=f"Name {new!r} in SILENCED_SYSTEM_CHECKS instead (docs/configuration.md, "
                                           "'System checks').", id="loom.W002")
            for new, olds in sorted(FORMER_IDS.items()) for old in olds if old in silenced and new not in silenced]


@register()
def check_settings(app_configs=None, **kwargs) -> list:
    return [
        Error(problem, hint="See docs/configuration.md for the type and range of each setting.", id="loom.E001")
        for problem in conf.problems()
    ]


@register()
def check_flow_modules(app_configs=None, **kwargs) -> list:
    from journal.flows.registry import flow_module_problems

    return [
        Error(problem, hint="List importable modules that declare flows (a dotted module path).", id="loom.E003")
        for problem in flow_module_problems(conf.get_safe("LOOM_FLOW_MODULES", []))
    ]


@register(deploy=False)
def check_databases(app_configs=None, **kwargs) -> list:
    messages = []
    for alias in settings.DATABASES:
        vendor = connections[alias].vendor
        if vendor not in {"postgresql", "sqlite"}:
            messages.append(
                Error(
                    f"database {alias!r} is {vendor}; the journal supports PostgreSQL and SQLite only",
                    id="loom.E002",
                )
            )
        elif vendor == "sqlite":
            mode = settings.DATABASES[alias].get("OPTIONS", {}).get("transaction_mode")
            if mode != "IMMEDIATE":
                messages.append(
                    Warning(
                        f"SQLite database {alias!r} does not use transaction_mode IMMEDIATE",
                        hint="Set DATABASES[...]['OPTIONS']['transaction_mode'] = 'IMMEDIATE' so that "
                        "concurrent appends wait for the write lock instead of failing with 'database is locked'.",
                        id="loom.W001",
                    )
                )
    return messages


@register()
def check_shards(app_configs=None, **kwargs) -> list:
    """loom.E020: LOOM_SHARDS names aliases DATABASES lacks (or twice), or a bad LOOM_SHARD_HISTORY;
    loom.E021: several shards but no ShardRouter, so the ORM queries of a run would not follow its shard."""
    from journal import shards

    messages = [
        Error(problem, hint="LOOM_SHARDS lists database aliases of DATABASES; docs/scaling.md \"Shards\".",
              id="loom.E020")
        for problem in shards.configuration_problems()
    ]
    try:
        several = len(conf.get("LOOM_SHARDS")) > 1
    except conf.ConfigError:
        several = False
    if several and not shards.router_installed():
        messages.append(Error(
            "LOOM_SHARDS names several databases but DATABASE_ROUTERS has no journal.shards.ShardRouter",
            hint='Add DATABASE_ROUTERS = ["journal.shards.ShardRouter"] (first, before routers of your own).',
            id="loom.E021"))
    return messages


@register()
def check_master_keys(app_configs=None, **kwargs) -> list:
    """loom.E030: fields are marked sensitive but there is no master key to seal them with.
    loom.E031: a stored data key names a master key LOOM_KEYS lacks, or LOOM_KEYS holds another key under
    its id: reads would fail (never show garbage), so the process refuses to start instead.

    The second needs the database: it runs only when a master key is configured, reads one wrapped key
    per master id (journal_datakey, through the journal store) and unwraps it."""
    from django.db import DatabaseError

    from journal.exceptions import MasterKeyError
    from journal.privacy import keys, marking
    from journal.store import store_for

    entries, service = conf.get_safe("LOOM_KEYS", None), conf.get_safe("LOOM_KEY_SERVICE", "")
    if entries is None or keys.keys_problem(entries) is not None:
        return []  # malformed: loom.E001 says why
    if not entries and not service:
        if marking.MARKED:
            return [Error(f"fields of {', '.join(sorted(marking.MARKED)[:5])} are marked sensitive but LOOM_KEYS is "
                          "empty", hint="Set LOOM_KEYS to id:base64-key (`manage.py loom_keys new`); docs/privacy.md.",
                          id="loom.E030")]
        return []
    messages = []
    for alias in settings.DATABASES:
        try:
            if "journal_datakey" not in connections[alias].introspection.table_names():
                continue
            in_use = store_for(alias).master_key_ids()
        except (DatabaseError, NotImplementedError):
            continue  # an unreachable database is not a key problem; the worker reports it
        for master_id, (wrapped, subject) in sorted(in_use.items()):
            try:
                keys.unwrap_for(keys.service(), master_id, b64decode(wrapped), subject)
            except MasterKeyError as exc:
                messages.append(Error(f"database {alias!r}: {exc}", id="loom.E031",
                                      hint="Give LOOM_KEYS every master key id still in use (docs/privacy.md, "
                                           "'Rotating the master key')."))
    return messages


@register()
def check_content_dir(app_configs=None, **kwargs) -> list:
    """loom.W032: the default content store's directory is relative: it follows each process's working
    directory, so a worker started elsewhere than the web server reads a different store (ContentMissing) and a
    forget erases blobs only in its own."""
    import os

    from journal.privacy import content

    if conf.get_safe("LOOM_CONTENT_STORAGE", "") or os.path.isabs(content.directory()):
        return []
    return [Warning(f"LOOM_CONTENT_DIR is the relative path {content.directory()!r}",
                    hint="Give an absolute path, or leave it empty with settings.BASE_DIR set "
                         "(<BASE_DIR>/var/loom-content); docs/privacy.md, 'The content store'.", id="loom.W032")]


DATABASE_SESSION_ENGINES = frozenset({"django.contrib.sessions.backends.db",
                                      "django.contrib.sessions.backends.cached_db"})


@register()
def check_session_engine(app_configs=None, **kwargs) -> list:
    """loom.W040: the admin's sessions are stored in the database (Django's default engine). A database role
    that can only SELECT reads a live staff or superuser session key from `django_session`, sends it as its
    cookie and is that user in the admin, where personal data is shown decrypted to those allowed to see it."""
    from django.apps import apps

    if not apps.is_installed("django.contrib.admin") or settings.SESSION_ENGINE not in DATABASE_SESSION_ENGINES:
        return []
    return [Warning(f"SESSION_ENGINE is {settings.SESSION_ENGINE!r}: whoever can read the django_session table "
                    "can replay a live admin session (a reporting role that may only SELECT becomes a superuser)",
                    hint='Use SESSION_ENGINE = "django.contrib.sessions.backends.signed_cookies" (or a cache '
                         "that no database reader can read), or keep every reporting role off django_session; "
                         "docs/security.md, 'What a database reader learns'.", id="loom.W040")]


# synchronous_commit values under which a commit is acknowledged only once a synchronous standby has it
# (remote_write: in the standby's memory; on: flushed to its disk; remote_apply: replayed). docs/scaling.md.
SYNCHRONOUS_COMMITS = ("remote_write", "on", "remote_apply")
REPLICATION_SQL = ("SELECT pg_is_in_recovery(), current_setting('synchronous_standby_names'), "
                   "current_setting('synchronous_commit'), (SELECT count(*) FROM pg_stat_replication)")


def failover_loss(cursor, several_hosts: bool = False) -> str | None:
    """Why a failover of the server `cursor` is connected to could lose acknowledged commits, or None.

    The rule (docs/scaling.md "High availability"): a server with a standby (a streaming replica in
    pg_stat_replication, or a DSN naming several hosts) loses what it acknowledged on promotion of that standby
    unless every commit waits for a synchronous standby: synchronous_standby_names set and synchronous_commit
    one of remote_write, on, remote_apply for this session. A server without standby has no failover to lose
    writes to (its own disk holds them: nothing to say); a standby (in recovery) is not written to."""
    cursor.execute(REPLICATION_SQL)
    in_recovery, standby_names, commit, streaming = cursor.fetchone()
    if in_recovery or not (streaming or several_hosts):
        return None
    if not (standby_names or "").strip():
        return (f"asynchronous replication: synchronous_standby_names is empty ({streaming} standby(s) streaming"
                + (", the DSN names several hosts" if several_hosts else "")
                + "), so a commit is acknowledged before any standby has it")
    if commit not in SYNCHRONOUS_COMMITS:
        return (f"synchronous_commit is {commit!r}: a commit is acknowledged before the synchronous standby "
                f"({standby_names}) has it")
    return None


FAILOVER_TAG = "loom_failover"  # loom_worker and loom_serve_api run W050 alone at start-up by this tag


@register(Tags.database, FAILOVER_TAG)
def check_failover_durability(app_configs=None, databases=None, **kwargs) -> list:
    """loom.W050: a PostgreSQL database with a standby replicates asynchronously (or this session commits with
    synchronous_commit local/off): an acknowledged append could be lost when the standby is promoted. One query
    per PostgreSQL alias; an unreachable database is skipped (the worker reports it); SQLite: nothing to say.
    A database check (it connects): Django runs it in `migrate` and `check --database`, loom_worker and
    loom_serve_api at start-up (run_failover_check); not in makemigrations, collectstatic and the like, which
    would each wait for a connect timeout during a failover. Without `databases` (Django 5.2 passes None when no
    --database was asked; Django 6 does not call it then): nothing, as Django's own database checks."""
    from django.db import DatabaseError

    messages = []
    for alias in databases or ():
        conn = connections[alias]
        if conn.vendor != "postgresql":
            continue
        several = "," in str(conn.settings_dict.get("HOST") or "")
        try:
            with conn.cursor() as cursor:
                problem = failover_loss(cursor, several)
        except DatabaseError:
            continue
        if problem:
            messages.append(Warning(
                f"database {alias!r} would lose acknowledged writes on failover: {problem}",
                hint="Set synchronous_standby_names on the primary (pg_auto_failover does: number_sync_standbys, "
                     "replication quorum) and keep synchronous_commit on; docs/scaling.md \"High availability\".",
                id="loom.W050"))
    return messages


def run_failover_check(command, options: dict) -> None:
    """loom.W050 at a long-running command's start (loom_worker, loom_serve_api), printed as Django prints
    checks; skipped with --skip-checks like the command's other checks."""
    if not options.get("skip_checks"):
        command.check(tags=[FAILOVER_TAG], databases=list(settings.DATABASES))
