"""System checks of reactions and projections (ids projections.E001...)."""

from __future__ import annotations

from importlib import import_module

from django.core.checks import Error, register

from journal import conf


@register()
def check_modules(app_configs=None, **kwargs) -> list:
    errors = []
    for module in conf.get_safe("LOOM_PROJECTION_MODULES", []):
        try:
            import_module(module)
        except ImportError as exc:
            errors.append(Error(f"LOOM_PROJECTION_MODULES: cannot import {module!r}: {exc}",
                                hint="List importable modules that declare reactions and projections.",
                                id="projections.E001"))
    return errors
