"""`bench_docs` writes docs/benchmarks.md from recorded runs: one run per block, each with its command.

The command runs here in `--small` mode (tiny sizes) into a temporary page holding hand-written text
and a stale block: afterwards every plan entry has a block with its exact command and the id of a run
recorded by that command, the goals block has one verdict per goal computed from those runs, the hand
text and the other database's block are kept, and the stale block is replaced. The goal functions are
checked on their own too: a verdict follows the figures.
"""

from __future__ import annotations

import io
import re
from types import SimpleNamespace

import pytest
from django.core.management import call_command
from django.db import connection

from benchmarks import goals
from benchmarks.docs_page import PLAN, merge, wrap
from benchmarks.models import BenchRun

HAND = "# Benchmarks\n\nMethodology written by hand: kept.\n\n"


@pytest.fixture(autouse=True)
def stop_the_process_lease_keeper(transactional_db):
    """As in tests/benchmarks/test_bench_smoke.py: the flows run in this process may start its lease keeper."""
    yield
    from leases.keeper import get_keeper, reset_keeper

    get_keeper().shutdown()
    reset_keeper(None)


def block(text: str, name: str) -> str:
    found = re.search(rf"<!-- bench_docs:begin {re.escape(name)} -->\n(.*?)<!-- bench_docs:end {re.escape(name)} -->",
                      text, re.S)
    assert found, f"no block {name}"
    return found[1]


@pytest.mark.django_db(transaction=True)
def test_small_run_writes_every_block_with_its_command_and_run(tmp_path):
    vendor = connection.vendor
    other = "sqlite" if vendor == "postgresql" else "postgresql"
    page = tmp_path / "benchmarks.md"
    page.write_text(HAND + wrap(f"throughput/{vendor}", "stale table") + "\nbetween\n\n"
                    + wrap(f"throughput/{other}", "the other database's table"))
    out = io.StringIO()
    call_command("bench_docs", "--small", "--output", str(page), stdout=out, stderr=io.StringIO())
    text = page.read_text()
    assert text.startswith(HAND) and "\nbetween\n" in text
    assert block(text, f"throughput/{other}").strip() == "the other database's table"
    assert "stale table" not in text
    for entry in PLAN:
        body = block(text, f"{entry.key}/{vendor}")
        command = re.search(r"^`DATABASE_URL=\S+ python manage\.py (\S+) (.*)`$", body, re.M)
        assert command and command[1] == entry.command and command[2] == " ".join(entry.small), entry.key
        run_id = re.search(r"^run #(\d+), ", body, re.M)
        assert run_id, f"{entry.key}: no run id"
        run = BenchRun.objects.get(pk=int(run_id[1]))
        assert run.command == entry.command and run.db_vendor == vendor
        assert run.status == BenchRun.Status.OK, f"{entry.key}: {run.error}"
        if entry.command != "bench_gate":  # the gate may fail its ratios after recording (tiny cells): said, kept
            assert "The command failed" not in body, body
        assert "| scenario |" in body  # at least one table of that run
    rows = [line for line in block(text, f"goals/{vendor}").splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) == len(goals.GOALS) + 1  # + the header
    for goal, row in zip(goals.GOALS, rows[1:], strict=True):
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert cells[0] == goal.name and cells[3] in (goals.MET, goals.NOT_MET, goals.NOT_MEASURED), row
        assert re.fullmatch(rf"#\d+ \({re.escape(goal.entry)}\)", cells[4]), row
    assert f"wrote the {vendor} blocks" in out.getvalue()

    # Rerunning one entry keeps the other blocks, and the goals of the others still name their runs.
    before = {e.key: block(text, f"{e.key}/{vendor}") for e in PLAN}
    call_command("bench_docs", "--small", "--only", "gate", "--output", str(page),
                 stdout=io.StringIO(), stderr=io.StringIO())
    again = page.read_text()
    assert all(block(again, f"{k}/{vendor}") == v for k, v in before.items() if k != "gate")
    assert block(again, f"gate/{vendor}") != before["gate"]
    assert "not run" not in block(again, f"goals/{vendor}")


def test_bench_docs_refuses_an_unknown_entry():
    from django.core.management.base import CommandError

    with pytest.raises(CommandError):
        call_command("bench_docs", "--only", "no-such-entry", stdout=io.StringIO(), stderr=io.StringIO())


def test_merge_replaces_only_the_named_blocks_and_adds_missing_ones_at_the_end():
    text = "intro\n" + wrap("a/x", "old a") + "middle\n" + wrap("b/x", "old b")
    merged = merge(text, {"a/x": "new a", "c/x": "new c"})
    assert "old a" not in merged and "new a" in merged and "old b" in merged
    assert merged.index("middle") < merged.index("new c") and merged.rstrip().endswith("<!-- bench_docs:end c/x -->")
    assert merge(merged, {"a/x": "new a", "c/x": "new c"}) == merged  # idempotent


def cell(section, scenario, throughput=None, p50=None, **params_and_metrics):
    metrics = params_and_metrics.pop("metrics", {})
    return SimpleNamespace(section=section, scenario=scenario, params=params_and_metrics, throughput=throughput,
                           p50_ms=p50, p99_ms=p50, metrics=metrics)


def test_a_goal_verdict_follows_the_figures():
    def append(ratio):
        return [cell("append", "per-event", 1000.0, concurrency=c) for c in (1, 8, 32)] + [
            cell("append", "ceiling", 1000.0 * ratio, concurrency=c) for c in (1, 8, 32)]

    assert goals.append_overhead(append(1.2)).verdict == goals.MET
    assert goals.append_overhead(append(1.3)).verdict == goals.NOT_MET
    assert goals.append_overhead(append(1.2)[:1] + append(1.2)[3:4]).verdict == goals.NOT_MEASURED  # 1 writer only
    lazy = [cell("lease", "caller/noop/lazy", mode="lazy", shape="noop", concurrency=16,
                 metrics={"overhead_pct": value}) for value in (2.0, None)]
    assert goals.lease_overhead("lazy", 5.0)(lazy[:1]).verdict == goals.MET
    assert goals.lease_overhead("lazy", 5.0)(lazy).verdict == goals.NOT_MEASURED  # spread too wide
    assert goals.reaction_latency([cell("latency", "latency 1000", 990.0, 60.0, rate=1000)]).verdict == goals.NOT_MET
    gate = [cell("gate", "eager lease cost", metrics={"ratio": 0.82, "limit": ">= 0.8", "passed": True,
                                                      "verdict": "ok"})]
    assert goals.gate_rule("eager lease cost")(gate).verdict == goals.MET
    assert goals.gate_rule("eager lease cost", goal_at_least=0.85)(gate).verdict == goals.NOT_MET
    assert goals.gate_rule("coalescing gain")(gate).verdict == goals.NOT_MEASURED
