"""Async flows driven from the loop (astart) on two real PostgreSQL shards: each run's journal calls are made from
the faces' pool threads, the shard binding travelling in the run's context, so every execution's events (and
its header) land on the shard shard_for names, and only there, its short in-process sleep slept on the loop.
Uses test_shards' databases (5432 and the `shard1` cluster on 5433: run under flock /tmp/loom-shards.lock)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.journal.test_shards import shard_env  # noqa: F401 (the module's two-shard databases)

pytestmark = pytest.mark.postgres

CHILD = """
import asyncio, json
import django
django.setup()
from journal import shards
from journal.flows import aio, flow
from journal.models import Event, Execution

@flow("shards.async_sleeper")
async def sleeper(ctx, value):
    first = await ctx.step("a", lambda: 1)
    await ctx.sleep(0.3)  # under LOOM_WAIT_INLINE_MAX: slept on the loop
    return first + await ctx.step("b", lambda: 2)

IDS = [f"asy-{i:02d}" for i in range(16)]

async def main():
    return await asyncio.gather(*(aio.astart("shards.async_sleeper", {}, eid) for eid in IDS))

facts = {"outcomes": [[o.status, o.result] for o in asyncio.run(main())], "placed": {}}
for eid in IDS:  # read back from this (sync) thread, on each shard
    facts["placed"][eid] = [shards.shard_for(eid), {
        alias: [Event.objects.using(alias).filter(stream_id=eid).count(),
                Execution.objects.using(alias).filter(pk=eid).count()] for alias in shards.shards()}]
print(json.dumps(facts))
"""


def test_a_loop_driven_async_run_writes_on_its_own_shard_only(shard_env):  # noqa: F811
    proc = subprocess.run([sys.executable, "-c", CHILD], env={**shard_env, "LOOM_WAIT_INLINE_MAX": "30"}, cwd=ROOT,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert facts["outcomes"] == [["completed", 3]] * 16
    homes = set()
    for eid, (home, counts) in facts["placed"].items():
        homes.add(home)
        for alias, (events, headers) in counts.items():
            expected = (2 * 3 + 2, 1) if alias == home else (0, 0)  # two steps and the sleep: 2n + 2, there only
            assert (events, headers) == expected, (eid, home, counts)
    assert homes == {"default", "shard1"}  # both shards were used
