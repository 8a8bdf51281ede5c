"""System checks of the leases app (ids loom.E1xx)."""

from __future__ import annotations

from django.core.checks import Error, register

from journal import conf


@register()
def check_lease_settings(app_configs=None, **kwargs) -> list:
    problems = []
    ttl = conf.get_safe("LOOM_LEASE_TTL", None)
    grace = conf.get_safe("LOOM_LEASE_LAZY_GRACE", None)
    if ttl is not None and grace is not None and grace >= ttl:
        problems.append(Error(
            f"LOOM_LEASE_LAZY_GRACE ({grace}) is not shorter than LOOM_LEASE_TTL ({ttl})",
            hint="A lazy run must take its lease well within a TTL; leave the grace unset (TTL/3).",
            id="loom.E101"))
    return problems
