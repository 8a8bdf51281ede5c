"""LOOM_* settings: typed, documented in one place, misconfiguration reported by system checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from journal import conf
from journal.checks import check_settings
from journal.management.commands.loom_settings import markdown_table

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


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


@pytest.mark.parametrize("channel", ["", "c" * 64, "é" * 32, "tab\there", "nul\x00"], ids=ascii)
def test_a_notify_channel_postgresql_cannot_use_is_reported(settings, channel):
    """Empty, over 63 bytes (PostgreSQL's identifier limit) or unprintable: loom.E001, not a failed append."""
    settings.LOOM_NOTIFY_CHANNEL = channel
    assert any("LOOM_NOTIFY_CHANNEL" in m.msg for m in check_settings() if m.id == "loom.E001")
    with pytest.raises(conf.ConfigError, match="LOOM_NOTIFY_CHANNEL"):
        conf.get("LOOM_NOTIFY_CHANNEL")


@pytest.mark.parametrize("channel", ["c" * 63, "Loom Journal", 'quote"d', "é" * 31], ids=ascii)
def test_any_printable_channel_of_at_most_63_bytes_is_accepted(settings, channel):
    settings.LOOM_NOTIFY_CHANNEL = channel
    assert conf.get("LOOM_NOTIFY_CHANNEL") == channel


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_appends_notify_on_a_channel_that_needs_quoting(settings):
    """The channel travels as a parameter of pg_notify(), so any accepted name works, quotes and case included."""
    import psycopg
    from django.db import connection

    from journal.envelopes import Envelope
    from journal.models import Event

    settings.LOOM_NOTIFY_CHANNEL = 'Loom "Quoted" ch'
    params = connection.get_connection_params()
    with psycopg.connect(**params, autocommit=True) as listener:
        listener.execute('LISTEN "Loom ""Quoted"" ch"')
        Event.objects.append("notified", Envelope("E"))
        received = next(listener.notifies(timeout=10, stop_after=1))
    assert received.channel == 'Loom "Quoted" ch' and '"notified"' in received.payload


def test_flow_modules_that_cannot_be_imported_are_a_system_check_error(settings):
    from journal.checks import check_flow_modules

    settings.LOOM_FLOW_MODULES = ["tests.fixtures.flows_fixtures", "tests.no_such_flows"]
    errors = check_flow_modules()
    assert [m.id for m in errors] == ["loom.E003"] and "tests.no_such_flows" in errors[0].msg


def test_a_typo_in_flow_modules_does_not_crash_start_up(child_env):
    """Before, ready() raised ModuleNotFoundError; now the process starts and `check` reports loom.E003."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    env = {**child_env, "LOOM_FLOW_MODULES": "tests.fixtures.flows_fixtures,tests.no_such_flows"}
    proc = subprocess.run([sys.executable, "manage.py", "check"], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0 and "loom.E003" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


OWNERS = {
    "journal": ("LOOM_MAX_PAYLOAD_BYTES", "LOOM_NOTIFY_CHANNEL", "LOOM_FLOW_MODULES", "LOOM_WORKER_ID",
                "LOOM_AGGREGATE_MODULES"),
    "leases": ("LOOM_LEASE_MODE", "LOOM_LEASE_TTL", "LOOM_RECOVERY_BATCH", "LOOM_WORKER_RETENTION"),
    "projections": ("LOOM_DRAIN_BATCH", "LOOM_CORRELATE_BATCH", "LOOM_PROJECTION_MODULES"),
    "loomapi": ("LOOM_API_TOKENS", "LOOM_API_MAX_WAIT"),
    "benchmarks": ("LOOM_RESULTS_PUBLIC",),
}


@pytest.mark.parametrize("app", sorted(OWNERS))
def test_each_setting_is_declared_by_the_app_that_owns_it(app):
    """The registry records who declared a setting; the journal's module names none of the apps above it."""
    assert all(conf.SETTINGS[name].app == app for name in OWNERS[app])
    if app != "journal":
        journal_source = (Path(conf.__file__)).read_text()
        assert not any(name in journal_source for name in OWNERS[app])
        assert f"### {app} (`{app}/conf.py`)" in markdown_table()


def test_a_name_two_apps_declare_is_refused(monkeypatch):
    monkeypatch.setattr(conf, "SETTINGS", dict(conf.SETTINGS))
    with pytest.raises(ValueError, match="LOOM_LEASE_TTL is declared by both 'leases' and 'projections'"):
        conf.register("projections", conf.Setting("LOOM_LEASE_TTL", float, 1.0, "again"))
    conf.register("leases", conf.Setting("LOOM_LEASE_TTL", float, 30.0, "again, same owner"))


def test_a_setting_no_installed_app_declares_is_a_named_error():
    with pytest.raises(conf.UnknownSetting, match="LOOM_NO_SUCH_SETTING"):
        conf.get("LOOM_NO_SUCH_SETTING")
    assert conf.get_safe("LOOM_NO_SUCH_SETTING", "fallback") == "fallback"


def test_settings_listing_redacts_secrets_of_every_app(settings):
    """`loom_settings` lists what every installed app registered, secrets (LOOM_API_TOKENS) redacted."""
    from io import StringIO

    from django.core.management import call_command

    settings.LOOM_API_TOKENS = ["very-secret-token"]
    out = StringIO()
    call_command("loom_settings", stdout=out)
    text = out.getvalue()
    assert "very-secret-token" not in text and "LOOM_API_TOKENS = '<redacted>'" in text
    assert all(f"{name} = " in text for names in OWNERS.values() for name in names)
