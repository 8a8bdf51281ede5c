"""LOOM_* settings: typed, documented in one place, misconfiguration reported by system checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from journal import conf
from journal.checks import check_settings
from journal.management.commands.loom_settings import markdown_table

DOC = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


def test_documentation_lists_every_setting():
    """docs/configuration.md carries the table generated from journal/conf.py, unchanged."""
    assert markdown_table() in DOC.read_text(), "regenerate with: python manage.py loom_settings --markdown"


def test_string_values_from_the_environment_are_coerced(settings):
    settings.LOOM_LEASE_TTL = "12.5"
    settings.LOOM_NOTIFY = "false"
    settings.LOOM_API_TOKENS = "a, b"
    assert conf.get("LOOM_LEASE_TTL") == 12.5
    assert conf.get("LOOM_NOTIFY") is False
    assert conf.get("LOOM_API_TOKENS") == ["a", "b"]


def test_unset_optional_setting_is_none(settings):
    settings.LOOM_SNAPSHOT_EVERY = ""
    assert conf.get("LOOM_SNAPSHOT_EVERY") is None


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("LOOM_MAX_PAYLOAD_BYTES", "lots", "is not a int"),
        ("LOOM_MAX_PAYLOAD_BYTES", 0, "below its minimum"),
        ("LOOM_LEASE_MODE", "sometimes", "not one of off, eager, lazy"),
        ("LOOM_NOTIFY", "maybe", "not a boolean"),
    ],
)
def test_bad_values_are_reported_by_a_system_check(settings, name, value, message):
    setattr(settings, name, value)
    errors = [m for m in check_settings() if m.id == "loom.E001"]
    assert any(message in m.msg and name in m.msg for m in errors)
    with pytest.raises(conf.ConfigError, match=name):
        conf.get(name)


def test_renewal_slower_than_ttl_is_reported(settings):
    settings.LOOM_LEASE_TTL = 5
    settings.LOOM_LEASE_RENEW_EVERY = 10
    assert any("LOOM_LEASE_RENEW_EVERY" in m.msg for m in check_settings() if m.id == "loom.E001")


def test_default_configuration_passes_checks():
    assert [m for m in check_settings() if m.id.startswith("loom.E")] == []
