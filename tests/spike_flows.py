"""The flow of the connection-spike test, in a module worker processes import (LOOM_FLOW_MODULES=tests.spike_flows):
it parks on a sleep, then records its effect once (an atomic step: its row and its record commit together)."""

from __future__ import annotations

from django.db import connection

from journal.flows import flow

EFFECTS = "spike_effects"


def create_table() -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE IF NOT EXISTS {EFFECTS} (execution_id text NOT NULL, step text NOT NULL)")


def record(execution_id: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {EFFECTS} (execution_id, step) VALUES (%s, 'after')", [execution_id])
    return "after"


@flow("spike.sleeper")
def sleeper(ctx, value):
    ctx.sleep(value["seconds"])
    return ctx.step("after", record, ctx.execution_id, atomic=True)
