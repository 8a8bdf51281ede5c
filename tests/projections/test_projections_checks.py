"""The projections app's system check: a module of LOOM_PROJECTION_MODULES that cannot be imported is
loom.E004 (its id was projections.E001 before the ids were unified under loom.*; silencing the old id still
silences it)."""

from __future__ import annotations

from projections.checks import check_modules


def test_an_unimportable_projection_module_is_loom_e004(settings):
    settings.LOOM_PROJECTION_MODULES = ["tests.no_such_projection_module"]
    errors = check_modules()
    assert [error.id for error in errors] == ["loom.E004"]
    assert "tests.no_such_projection_module" in errors[0].msg


def test_the_old_id_silences_it_still(settings):
    settings.LOOM_PROJECTION_MODULES = ["tests.no_such_projection_module"]
    settings.SILENCED_SYSTEM_CHECKS = ["projections.E001"]
    assert check_modules() == []


def test_importable_modules_raise_nothing(settings):
    settings.LOOM_PROJECTION_MODULES = ["tests.waits_flows"]
    assert check_modules() == []
