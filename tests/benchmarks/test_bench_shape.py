"""Every bench command has one shape: a thin `BenchCommand` listing section modules of benchmarks/sections.

A section is a module with `run(ctx)` and, optionally, `add_arguments(parser)`; its options must not clash
with another section's of the same command (argparse would refuse to build the parser). Child processes
of a bench use the database the run writes to, built from the connection's settings.
"""

from __future__ import annotations

import importlib
import inspect

import environ
import pytest
from django.core.management import get_commands, load_command_class
from django.db import connection

from benchmarks import sections
from benchmarks.children import database_url
from benchmarks.command import BenchCommand

SECTION_MAPS = {name: value for name, value in vars(sections).items() if name.endswith("_SECTIONS")}
NOT_BENCHES = {"bench_check", "bench_report", "bench_docs"}  # read recorded runs; they measure nothing


def bench_commands() -> dict[str, str]:
    return {name: app for name, app in get_commands().items() if name.startswith("bench_") and name not in NOT_BENCHES}


def test_every_bench_command_is_a_bench_command_over_one_map_of_section_modules():
    commands = bench_commands()
    assert {"bench_throughput", "bench_lease", "bench_reactions", "bench_aggregates", "bench_http",
            "bench_gate"} <= set(commands)
    mapped = {path for m in SECTION_MAPS.values() for path in m.values()}
    for name, app in commands.items():
        command = load_command_class(app, name)
        assert isinstance(command, BenchCommand), name
        assert command.sections and set(command.sections.values()) <= mapped, name
        command.create_parser("manage.py", name)  # every section's options, together, without a clash
        source = inspect.getsource(type(command))
        assert "SimpleNamespace" not in source and "_modules" not in source, name


@pytest.mark.parametrize("path", sorted({p for m in SECTION_MAPS.values() for p in m.values()}))
def test_every_section_is_a_module_with_run(path):
    module = importlib.import_module(path)
    assert callable(getattr(module, "run", None)), path
    assert list(inspect.signature(module.run).parameters) == ["ctx"], path


@pytest.mark.django_db
def test_a_child_is_given_the_database_of_the_connection_not_the_environment(monkeypatch):
    """The URL built from the connection names the same database when read back as settings."""
    monkeypatch.setenv("DATABASE_URL", "postgres://nobody@127.0.0.1:9/elsewhere")
    parsed = environ.Env.db_url_config(database_url())
    ours = connection.settings_dict
    assert parsed["NAME"] == ours["NAME"]
    if connection.vendor == "postgresql":
        assert (parsed["HOST"], int(parsed["PORT"]), parsed["USER"]) == (
            ours["HOST"] or "127.0.0.1", int(ours["PORT"] or 5432), ours["USER"] or "postgres")
