"""System checks of reactions and projections (ids loom.E004...; loom.* like every library app's checks).

`loom.E004` was `projections.E001` before the check ids were unified: a project that silences the old id
(SILENCED_SYSTEM_CHECKS) still silences it.
"""

from __future__ import annotations

from importlib import import_module

from django.conf import settings
from django.core.checks import Error, register

from journal import conf

OLD_IDS = {"loom.E004": "projections.E001"}  # id -> the id it had before (still honoured when silenced)


@register()
def check_modules(app_configs=None, **kwargs) -> list:
    if OLD_IDS["loom.E004"] in getattr(settings, "SILENCED_SYSTEM_CHECKS", ()):
        return []
    errors = []
    for module in conf.get_safe("LOOM_PROJECTION_MODULES", []):
        try:
            import_module(module)
        except ImportError as exc:
            errors.append(Error(f"LOOM_PROJECTION_MODULES: cannot import {module!r}: {exc}",
                                hint="List importable modules that declare reactions and projections.",
                                id="loom.E004"))
    return errors
