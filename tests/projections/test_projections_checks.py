"""The projections app's system check: a module of LOOM_PROJECTION_MODULES that cannot be imported is
loom.E401 (projections' range of loom.*; it was loom.E004, and projections.E001 before that: silencing a
former id still silences it until 0.3)."""

from __future__ import annotations

import pytest

from projections.checks import check_modules


def test_an_unimportable_projection_module_is_loom_e401(settings):
    settings.LOOM_PROJECTION_MODULES = ["tests.no_such_projection_module"]
    errors = check_modules()
    assert [error.id for error in errors] == ["loom.E401"]
    assert "tests.no_such_projection_module" in errors[0].msg


@pytest.mark.parametrize("former", ["projections.E001", "loom.E004"])
def test_a_former_id_silences_it_still(settings, former):
    settings.LOOM_PROJECTION_MODULES = ["tests.no_such_projection_module"]
    settings.SILENCED_SYSTEM_CHECKS = [former]
    assert check_modules() == []


def test_importable_modules_raise_nothing(settings):
    settings.LOOM_PROJECTION_MODULES = ["tests.fixtures.waits_flows"]
    assert check_modules() == []
