"""What a recorded run says about itself, and what a bench command refuses before recording anything.

A run's `source_hash` must change with the measuring code (benchmarks/) as well as the runtime, and its
`git_dirty` flag must see files that are not committed yet, untracked ones included. A bad argument
(text, zero, a negative count) is a CommandError raised while the command line is parsed: no BenchRun.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from benchmarks import environment
from benchmarks.models import BenchRun

ROOT = Path(__file__).resolve().parents[2]


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=bench@example.org", "-c", "user.name=bench", *args], cwd=repo,
                   check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path) -> Path:
    """A throw-away git checkout holding a copy of the packages the source hash covers, committed."""
    for package in environment.MEASURED_PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "static", "templates"))
    (tmp_path / ".gitignore").write_text("__pycache__/\n*.pyc\n/var/\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-q", "-m", "copy")
    return tmp_path


def test_source_hash_changes_with_the_benchmarks_code_and_the_runtime(repo):
    """Editing a benchmark section (the measuring code) or the journal changes the hash; it is never empty."""
    first = environment.source_hash(repo)
    assert len(first) == 64 and int(first, 16) >= 0
    section = repo / "benchmarks" / "sections" / "read.py"
    section.write_text(section.read_text() + "\n# a change to how reads are measured\n")
    second = environment.source_hash(repo)
    assert second != first
    store = repo / "journal" / "store" / "postgres.py"
    store.write_text(store.read_text() + "\n# a change to the runtime\n")
    assert environment.source_hash(repo) not in (first, second)


def test_source_hash_ignores_what_does_not_run():
    """The hash of this checkout is stable between two calls and covers benchmarks/ (named in the list)."""
    assert "benchmarks" in environment.MEASURED_PACKAGES
    assert environment.source_hash() == environment.source_hash() != ""


def test_git_dirty_sees_untracked_modified_and_clean_states(repo):
    """Clean right after the commit; dirty with an untracked file; dirty with a modified one; ignored
    files (bytecode, var/) do not count."""
    assert environment.git_dirty(repo) is False
    (repo / "var").mkdir()
    (repo / "var" / "bench.sqlite3").write_text("ignored")
    assert environment.git_dirty(repo) is False
    extra = repo / "benchmarks" / "sections" / "new_section.py"
    extra.write_text("def run(ctx): ...\n")
    assert environment.git_dirty(repo) is True
    extra.unlink()
    assert environment.git_dirty(repo) is False
    (repo / "journal" / "__init__.py").write_text("# edited\n")
    assert environment.git_dirty(repo) is True


@pytest.mark.django_db
def test_a_recorded_run_carries_the_hash_and_dirty_flag_of_this_checkout():
    """The Recorder stores exactly what the environment functions say."""
    from benchmarks.recording import Recorder

    with Recorder("bench_test", {}) as rec:
        pass
    run = BenchRun.objects.get(pk=rec.run.pk)
    assert run.source_hash == environment.source_hash() and len(run.source_hash) == 64
    assert run.git_dirty == environment.git_dirty()


BAD_ARGUMENTS = [
    ("bench_throughput", ["--concurrency", "abc"]),
    ("bench_throughput", ["--concurrency", "0"]),
    ("bench_throughput", ["--concurrency", "-3"]),
    ("bench_throughput", ["--concurrency", "1,0"]),
    ("bench_throughput", ["--ops", "0"]),
    ("bench_throughput", ["--ops", "-5"]),
    ("bench_throughput", ["--payload-bytes", "-1"]),
    ("bench_throughput", ["--repeats", "0"]),
    ("bench_throughput", ["--read-ops", "x"]),
    ("bench_throughput", ["--flow-concurrency", "4,-1"]),
    ("bench_throughput", ["--flow-coalesce", "maybe"]),
    ("bench_throughput", ["--exec-concurrency", "0"]),
    ("bench_throughput", ["--effect-ms", "-2"]),
    ("bench_throughput", ["--transient-calls", "0"]),
    ("bench_lease", ["--lease-concurrency", "abc"]),
    ("bench_lease", ["--lease-repeats", "0"]),
    ("bench_lease", ["--lease-shapes", "noop,slow"]),
    ("bench_reactions", ["--rates", "idle,0"]),
    ("bench_reactions", ["--seconds", "0"]),
    ("bench_reactions", ["--workers", "-1"]),
    ("bench_reactions", ["--replay", "ten"]),
    ("bench_aggregates", ["--iterations", "0"]),
    ("bench_aggregates", ["--contenders", "-20"]),
    ("bench_http", ["--requests", "0"]),
    ("bench_http", ["--concurrency", "4", "-1"]),
    ("bench_http", ["--workers", "0"]),
    ("bench_http", ["--warmup", "-1"]),
    ("bench_gate", ["--gate-repeats", "0"]),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("command", "argv"), BAD_ARGUMENTS, ids=[" ".join([c, *a]) for c, a in BAD_ARGUMENTS])
def test_bad_bench_arguments_are_refused_before_anything_is_recorded(command, argv):
    """Text, zero or negative counts: a CommandError naming the argument, and no BenchRun row at all."""
    before = BenchRun.objects.count()
    with pytest.raises(CommandError) as raised:
        call_command(command, *argv, "--quiet")
    assert f"argument {argv[0]}" in str(raised.value)
    assert BenchRun.objects.count() == before


def test_bad_arguments_on_the_command_line_exit_2_without_a_traceback(child_env):
    """From a shell: argparse's usage message and exit status 2, not a traceback."""
    import sys

    proc = subprocess.run([sys.executable, "manage.py", "bench_throughput", "--concurrency", "abc"], cwd=ROOT,
                          env=child_env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "argument --concurrency" in proc.stderr and "Traceback" not in proc.stderr


# --- what the figures count ---------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_statement_counter_sees_every_statement_of_connections_opened_in_any_thread():
    """Appends in a worker thread are counted at the driver, including the PostgreSQL store's server-side
    prepared statements (which bypass Django's execute wrappers): one statement per append there; on
    SQLite the open is several (BEGIN, guard reads, insert, COMMIT) and each append in autocommit one. The calling
    thread's own connection, opened before, is not counted."""
    import threading

    from django.db import connection, connections

    from benchmarks.harness import counting_statements
    from journal.envelopes import Envelope
    from journal.models import Event

    appends = 5
    connection.ensure_connection()

    def work() -> None:
        try:
            Event.objects.open_stream("count-1", Envelope("Opened"))
            for _ in range(appends):
                Event.objects.append("count-1", Envelope("Added"), fence_token=1)
        finally:
            connections.close_all()

    with counting_statements() as counter:
        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
        Event.objects.tip("count-1")  # this thread's connection: not counted
    statements, control = counter.snapshot()
    if connection.vendor == "postgresql":
        assert statements == appends + 1 and control == 0
    else:
        # the open is a transaction of several (BEGIN, guard reads, insert, COMMIT); each append in autocommit
        # is the lean path's one statement (journal/store/sqlite_lean.py, issue 33): every one of them counted
        assert statements >= (appends + 1) + 2 and control >= 2


def test_a_lease_overhead_inside_the_spread_of_its_repeats_is_not_a_result():
    """The SQLite case: eager leases "faster" than none, repeats from -112 % to +19 %: spread too wide.
    A tight spread around a real cost is an overhead; a single repeat says nothing."""
    from benchmarks.sections.lease import SPREAD_TOO_WIDE, overhead_verdict

    assert overhead_verdict(-46.0, [-112.2, -10.7, 18.9]) == SPREAD_TOO_WIDE
    assert overhead_verdict(14.3, [-14.8, 14.3, 19.6]) == SPREAD_TOO_WIDE
    assert overhead_verdict(8.0, [7.0, 8.0, 9.5]) == "overhead"
    assert overhead_verdict(-30.0, [-33.0, -30.0, -28.0]) == "faster"
    assert overhead_verdict(8.0, [8.0]) == SPREAD_TOO_WIDE
