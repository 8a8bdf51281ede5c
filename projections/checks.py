"""System checks of reactions and projections (ids loom.E401...: projections' range of the library's loom.*
namespace, docs/configuration.md "System checks").

`loom.E401` was `loom.E004`, and `projections.E001` before that: a project that silences a former id
(SILENCED_SYSTEM_CHECKS) still silences it until 0.3, and loom.W002 tells it the id to name instead.
"""

from __future__ import annotations

from importlib import import_module

from django.core.checks import Error, register

from journal import conf
from journal.checks import honouring_former_ids, renamed

renamed({"loom.E401": ("loom.E004", "projections.E001")})


@register()
@honouring_former_ids
def check_modules(app_configs=None, **kwargs) -> list:
    errors = []
    for module in conf.get_safe("LOOM_PROJECTION_MODULES", []):
        try:
            import_module(module)
        except ImportError as exc:
            errors.append(Error(f"LOOM_PROJECTION_MODULES: cannot import {module!r}: {exc}",
                                hint="List importable modules that declare reactions and projections.",
                                id="loom.E401"))
    return errors
