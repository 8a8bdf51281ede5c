"""Review (wave 15, engineer f): `manage.py loom` with the database gone mid-verb. The journal names an append
the server dropped DatabaseUnavailable (retryable, in doubt: journal/exceptions.py); the CLI's verbs took it for
one of the journal's refusals, exit 1 "refused" (a script does not retry a refusal), instead of exit 4 "could not
be reached" as the same drop anywhere else in a verb gives (docs/cli.md). PostgreSQL (SQLite has no server to
lose). A time given with an offset that puts it outside year 1..9999 in UTC (--since 0001-01-01T00:00+14:00) gave
an OverflowError traceback instead of a usage error (exit 2). Both databases."""

from __future__ import annotations

import json

import pytest
from django.core.management import CommandError, call_command

from journal.flows import flow, start
from journal.store import postgres
from tests.leases.test_failover import unreachable  # noqa: F401  (the fixture)

pytestmark = pytest.mark.django_db(transaction=True)


@flow("tests.review_f.fails")
def fails(ctx, value: int) -> int:
    raise RuntimeError("always")


@pytest.mark.postgres
def test_a_retry_whose_append_the_server_drops_exits_4_not_refused(unreachable, monkeypatch, capsys):  # noqa: F811
    cut, restore = unreachable
    assert start("tests.review_f.fails", 1, execution_id="rev-f-cli-1").status == "failed"
    real = postgres.PostgresStore._append

    def dropped(self, items, encoded):  # the server goes away as the verb's append is sent (a failover)
        cut()
        return real(self, items, encoded)

    monkeypatch.setattr(postgres.PostgresStore, "_append", dropped)
    with pytest.raises(CommandError) as exited:
        call_command("loom", "executions", "retry", "rev-f-cli-1", "--json")
    monkeypatch.undo()
    restore()
    said = json.loads(capsys.readouterr().out)
    assert said["ok"] is False and said["type"] == "DatabaseUnavailable", said
    assert exited.value.returncode == 4, said  # was 1: "refused or not found"


@pytest.mark.parametrize("option", [("--since", "0001-01-01T00:00+14:00"), ("--until", "9999-12-31T23:59-14:00")])
def test_a_time_outside_the_calendar_in_utc_is_a_usage_error(option, capsys):
    with pytest.raises(CommandError) as exited:
        call_command("loom", "executions", "list", *option, "--json")
    said = json.loads(capsys.readouterr().out)
    assert exited.value.returncode == 2 and option[0] in said["error"], said
