"""`bench_report` prints a recorded run as the Markdown the docs are made of."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from benchmarks.recording import Recorder

pytestmark = pytest.mark.django_db


def test_prints_the_latest_run_with_its_cells_and_skips():
    with Recorder("bench_throughput", {"ops": 10}) as rec:
        rec.add("append", "per-event", {"concurrency": 8}, throughput=1234.5, unit="events/s",
                latencies_ms=[1.0, 2.0, 3.0], count=3, verified_rows=3)
        rec.skip("notify", "needs PostgreSQL")
    out = StringIO()
    call_command("bench_report", stdout=out)
    text = out.getvalue()
    assert "## append" in text
    assert "| per-event | concurrency=8 | 1,234 | events/s | 2.00 |" in text
    assert "`notify` skipped: needs PostgreSQL" in text


def test_unknown_run_is_a_clear_error():
    with pytest.raises(CommandError, match="no recorded run 999"):
        call_command("bench_report", "999")
