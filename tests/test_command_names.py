"""Loom's management commands are named `loom_*` (the benchmarks `bench_*`); the two older unprefixed
names stay as aliases of the same command (issue 32)."""

from __future__ import annotations

from django.core.management import get_commands, load_command_class

ALIASES = {"serve_api": "loom_serve_api", "drain": "loom_drain"}  # old name -> the command it stands for
LOOM_APPS = ("journal", "leases", "queues", "projections", "loomapi", "benchmarks")


def test_every_loom_command_is_prefixed_or_a_named_alias():
    ours = {name for name, app in get_commands().items() if app in LOOM_APPS}
    assert {"loom_serve_api", "loom_drain", "loom_worker", "loom"} <= ours
    odd = sorted(name for name in ours
                 if not (name == "loom" or name.startswith(("loom_", "bench_")) or name in ALIASES))
    assert odd == []


def test_an_old_name_runs_the_same_command_as_its_new_name():
    commands = get_commands()
    for old, new in ALIASES.items():
        assert commands[old] == commands[new]
        assert type(load_command_class(commands[old], old)) is type(load_command_class(commands[new], new))
