"""Review (wave 15, engineer f): `manage.py loom` with the database gone mid-verb. The journal names an append
the server dropped DatabaseUnavailable (retryable, in doubt: journal/exceptions.py); the CLI's verbs took it for
one of the journal's refusals, exit 1 "refused" (a script does not retry a refusal), instead of exit 4 "could not
be reached" as the same drop anywhere else in a verb gives (docs/cli.md). PostgreSQL (SQLite has no server to
lose)."""

from __future__ import annotations

import json

import pytest
from django.core.management import CommandError, call_command

from journal.flows import flow, start
from journal.store import postgres
from tests.leases.test_failover import unreachable  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@flow("tests.review_f.fails")
def fails(ctx, value: int) -> int:
    raise RuntimeError("always")


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
