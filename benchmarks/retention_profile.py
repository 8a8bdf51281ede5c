"""What one removal batch spends its time on, statement by statement, early and late in a long removal, with and
without the run's cursor (journal/retention.py `run`, store SINCE; docs/benchmarks.md "Removal pacing", the
per-batch profile).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/loom_retain_prof \\
    python manage.py shell -c "from benchmarks.retention_profile import main; main(executions=300_000, batches=2_800)"

Per mode (`modes`, in turn: interleave by listing them again): VACUUM, a fill of `executions` settled executions of
10 events each spread over 400 days (the growth section's fill_settled), then `batches` batches of removal of what
is past 30 days, one at a time (retention.run, max_batches=1), the run's cursor carried from batch to batch
("cursor") or not ("none": each batch scans from the oldest finished_at). Every statement is timed on the
client (connection.execute_wrapper). Prints one JSON document: per mode, the batches' median time and each
statement's median time per batch in the first, middle and last tenth of the batches. No appends run.
"""

from __future__ import annotations

import json
import re
import statistics
import time

from django.db import connection
from django.test import override_settings
from django.utils import timezone

from journal import retention
from journal.store import retention_store_for

PER_STREAM = 10
DAYS = 400.0
FLOW = "bench.profile.settled"


def _name(sql: str) -> str:
    """A statement's first words, its parameter lists folded (one name per statement of a batch)."""
    return re.sub(r"%s(, %s)+", "%s..", " ".join(sql.split()))[:48]


def _one(mode: str, executions: int, batches: int, run: int) -> dict:
    store = retention_store_for()
    store.vacuum()  # each mode starts from a vacuumed table: the dead entries are its own run's
    prefix = f"prof{run}_{int(time.time())}_"
    for start in range(0, executions, 100_000):
        store.fill_settled(prefix, start, min(100_000, executions - start), PER_STREAM, '{"data":"filled"}', DAYS,
                           FLOW)
    store.checkpoint()
    spent: dict[str, float] = {}

    def timed(execute, sql, params, many, context):
        began = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            spent[_name(sql)] = spent.get(_name(sql), 0.0) + (time.perf_counter() - began) * 1000

    rows: list[tuple[float, dict[str, float]]] = []
    carried: dict = {}
    with override_settings(LOOM_RETENTION_DAYS=None, LOOM_RETENTION_FLOWS=[f"{FLOW}=30"], LOOM_RETENTION_BATCH=100,
                           LOOM_ARCHIVE_FLOWS=[]):
        at = timezone.now()
        with connection.execute_wrapper(timed):
            for _ in range(batches):
                spent.clear()
                began = time.perf_counter()
                done = retention.run(connection.alias, now=at, max_batches=1,
                                     cursor=carried if mode == "cursor" else None)
                if not done["batches"]:
                    break
                rows.append(((time.perf_counter() - began) * 1000, dict(spent)))
    tenth = max(1, len(rows) // 10)
    parts = {"first": rows[:tenth], "middle": rows[len(rows) // 2:len(rows) // 2 + tenth], "last": rows[-tenth:]}
    return {"mode": mode, "batches": len(rows), "removal_s": round(sum(r[0] for r in rows) / 1000, 2),
            **{part: {"batch_ms": round(statistics.median(r[0] for r in found), 2),
                      "statements_ms": {name: round(statistics.median(r[1].get(name, 0.0) for r in found), 2)
                                        for name in sorted(found[0][1])}}
               for part, found in parts.items() if found}}


def main(executions: int = 300_000, batches: int = 2_800,
         modes: tuple[str, ...] = ("cursor", "none", "cursor")) -> None:
    print(json.dumps([_one(mode, executions, batches, n) for n, mode in enumerate(modes)], indent=1))
