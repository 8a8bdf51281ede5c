"""Section `transient`: calls/s of `invoke_transient` for the 1-step no-op flow of `durable`.

One thread (one core), calls back to back. It writes nothing, so only our own overhead counts;
the section verifies that by counting the rows of every table before and after.
"""

from __future__ import annotations

import statistics
import time

from django.db import connection

from benchmarks.arguments import positive_int
from benchmarks.sections import durable  # noqa: F401  (registers bench.noop1)
from journal.flows import invoke_transient


def add_arguments(parser) -> None:
    parser.add_argument("--transient-calls", type=positive_int, default=200_000,
                        help="invoke_transient calls per repeat (default 200000).")
    parser.add_argument("--transient-repeats", type=positive_int, default=5,
                        help="Repeats; the median is recorded (default 5).")


def all_rows() -> int:
    total = 0
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names(cursor):
            cursor.execute(f'SELECT count(*) FROM "{table}"')
            total += cursor.fetchone()[0]
    return total


def run(ctx) -> None:
    calls = ctx.options["transient_calls"]
    repeats = ctx.options["transient_repeats"]
    value: dict = {}
    before = all_rows()
    rates, checks = [], 0
    bar = ctx.progress(calls * repeats, "invoke_transient")
    for _ in range(repeats):
        began = time.perf_counter()
        for _ in range(calls):
            out = invoke_transient("bench.noop1", value)
        elapsed = time.perf_counter() - began
        checks += out.result == 1
        rates.append(calls / elapsed)
        bar.update(calls)
    bar.close()
    ctx.verify("repeats that returned the step's result", repeats, checks)
    ctx.verify("rows written by invoke_transient (all tables; the recorder writes after)", before, all_rows())
    ctx.record("invoke_transient", {"steps": 1, "calls": calls, "repeats": repeats, "threads": 1},
               throughput=statistics.median(rates), unit="calls/s", count=calls * repeats,
               best=round(max(rates), 1), worst=round(min(rates), 1),
               us_per_call=round(1e6 / statistics.median(rates), 3), rows_written=0)
