"""Loom's management commands are named `loom_*` (the benchmarks `bench_*`); the two older unprefixed names
(`drain`, `serve_api`) still run their new command for one release, after a deprecation warning on stderr that
names it (issue 32; they go in 0.3, docs/cli.md)."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command, get_commands, load_command_class

ALIASES = {"serve_api": "loom_serve_api", "drain": "loom_drain"}  # old name -> the command it stands for
LOOM_APPS = ("journal", "leases", "queues", "projections", "loomapi", "benchmarks")


def test_every_loom_command_is_prefixed_or_a_named_alias():
    ours = {name for name, app in get_commands().items() if app in LOOM_APPS}
    assert {"loom_serve_api", "loom_drain", "loom_worker", "loom"} <= ours
    odd = sorted(name for name in ours
                 if not (name == "loom" or name.startswith(("loom_", "bench_")) or name in ALIASES))
    assert odd == []


def test_an_old_name_is_the_new_command_with_its_arguments():
    """The alias is the new command (a subclass that only warns first): same app, same options."""
    commands = get_commands()
    for old, new in ALIASES.items():
        assert commands[old] == commands[new]
        alias, command = load_command_class(commands[old], old), load_command_class(commands[new], new)
        assert isinstance(alias, type(command))
        assert type(alias).handle is not type(command).handle  # it warns, then runs the new handle
        old_options = {a.dest for a in alias.create_parser("manage.py", old)._actions}
        assert old_options == {a.dest for a in command.create_parser("manage.py", new)._actions}
        assert "Deprecated" in alias.help and new in alias.help


@pytest.mark.django_db(transaction=True)
def test_drain_warns_on_stderr_naming_loom_drain_and_still_drains():
    out, err = StringIO(), StringIO()
    call_command("drain", stdout=out, stderr=err)
    assert "deprecated" in err.getvalue() and "manage.py loom_drain" in err.getvalue()
    assert out.getvalue().startswith("handled ")  # loom_drain's own report: the drain ran
    new_out, new_err = StringIO(), StringIO()
    call_command("loom_drain", stdout=new_out, stderr=new_err)
    assert new_err.getvalue() == "" and new_out.getvalue().startswith("handled ")


@pytest.mark.django_db
def test_serve_api_warns_on_stderr_naming_loom_serve_api_and_still_runs_it():
    """loom_serve_api's own refusal (a bad --workers, before any server starts) proves its handle ran."""
    err = StringIO()
    with pytest.raises(CommandError, match="--workers and --threads must be at least 1"):
        call_command("serve_api", "--workers", "0", stderr=err)
    assert "deprecated" in err.getvalue() and "manage.py loom_serve_api" in err.getvalue()
    new_err = StringIO()
    with pytest.raises(CommandError, match="--workers and --threads must be at least 1"):
        call_command("loom_serve_api", "--workers", "0", stderr=new_err)
    assert "deprecated" not in new_err.getvalue()
