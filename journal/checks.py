"""System checks: misconfiguration is reported at start-up with an id, not inside a worker."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Error, Warning, register
from django.db import connections

from journal import conf


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
