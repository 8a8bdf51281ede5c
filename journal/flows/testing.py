"""Test helpers for flows: `replay(...)` is the replay check (journal/flows/replay.py) inside a test.

    from journal.flows.testing import replay

    def test_the_new_code_resumes_what_the_old_code_left(db):
        replay(histories=["tests/histories/order-42.json"])   # files `manage.py loom executions export` wrote
        replay(["order-42"])                                   # or executions in the test database

Each raises AssertionError naming the first execution and position a resume would refuse, with the
reason; it returns the results otherwise. Nothing is written.
"""

from __future__ import annotations

from journal.flows import replay as replaying
from journal.flows.replay import History, ReplayResult


def replay(execution_ids: list[str] | None = None, *, histories: list[str | History] | None = None,
           flows: list[str] | None = None, last: int = 20, settled: bool = False) -> list[ReplayResult]:
    """Replay executions (ids), histories (History objects or paths of exported files), or the newest `last`
    of each flow; AssertionError on the first that fails."""
    loaded = [h if isinstance(h, History) else replaying.load_file(h) for h in histories or []]
    results = replaying.replay(execution_ids, flows=flows, last=last, settled=settled, histories=loaded)
    failures = [result for result in results if not result.ok]
    if failures:
        first = failures[0]
        raise AssertionError(f"replay of {len(results)} history(ies): {len(failures)} would not resume on this code; "
                             f"the first: {first.line()}")
    return results
