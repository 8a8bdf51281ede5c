"""What both releases of tests/version_flows_v*.py and tests/version_queued_v*.py share, in a module that
registers no flow (a worker listing only the version-2 modules must not get version 1 through an import)."""

from __future__ import annotations

import os

from django.db import connection

#: Who ran which version of an execution: one row per run of a version's recording step (raw SQL, made by
#: the test: a step's effect commits with the step, so a completed execution has exactly one row).
EFFECTS = "test_version_effects"


def worker_id() -> str:
    return os.environ.get("LOOM_WORKER_ID", f"pid-{os.getpid()}")


def create_effects_table() -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE IF NOT EXISTS {EFFECTS} (execution_id varchar(200), version integer,"
                       " worker varchar(200))")
        cursor.execute(f"DELETE FROM {EFFECTS}")


def drop_effects_table() -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {EFFECTS}")


def effects() -> list[tuple[str, int, str]]:
    """(execution id, version, worker) of every recorded run, by execution id."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT execution_id, version, worker FROM {EFFECTS} ORDER BY execution_id, version")
        return [tuple(r) for r in cursor.fetchall()]


def record(execution_id: str, version: int) -> str:
    """The recording step of version `version`: a row (execution, version, this worker); the worker's id."""
    who = worker_id()
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {EFFECTS} (execution_id, version, worker) VALUES (%s, %s, %s)",
                       [execution_id, version, who])
    return who
