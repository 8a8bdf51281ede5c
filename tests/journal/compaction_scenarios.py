"""Child processes of tests/journal/test_compaction_shards.py: compaction and re-snapshot over shards, each scenario
in a Django process configured for several shards (the environment names them: two PostgreSQL servers, or two
SQLite files), printing one JSON line of facts for the test to assert on.

    python -m tests.journal.compaction_scenarios <scenario> [json argument]
"""

from __future__ import annotations

import io
import json
import threading
import time

from tests.fixtures import shard_scenarios

LOCK = "SELECT pg_advisory_xact_lock(1282371437, 2)"  # the compactor's key (journal/store/retention.py)


def _declare():
    """The compacted state of these scenarios (imported after django.setup(): a State needs the app registry)."""
    from tests.journal import aggregate_states

    return aggregate_states.tally("ShardTally", snapshot_every=5, compact=True)


def _old_code_snapshots(st, ids: dict[str, list[str]]) -> None:
    """The newest snapshot of the first stream of each shard's `ids` as an older code took it (`n` only)."""
    from journal import shards
    from journal.models import Snapshot

    for alias, names in ids.items():
        with shards.bound(alias):
            newest = Snapshot.objects.filter(stream_id=st.stream(names[0])).order_by("-seq").first()
            Snapshot.objects.filter(pk=newest.pk).update(state={"n": newest.state["n"]})


def _ids(run: str, per_shard: int, aliases: list[str]) -> dict[str, list[str]]:
    """Aggregate ids whose streams fall on each of `aliases`."""
    from journal import shards

    want: dict[str, list[str]] = {alias: [] for alias in aliases}
    i = 0
    while any(len(v) < per_shard for v in want.values()):
        candidate = f"{run}-{i}"
        bucket = want.get(shards.shard_for(f"ShardTally-{candidate}"))
        if bucket is not None and len(bucket) < per_shard:
            bucket.append(candidate)
        i += 1
    return want


def _bump(action, ids: list[str], times: int) -> None:
    from journal.aggregates import do

    for id in ids:
        for _ in range(times):
            do(action, id, {"by": 1})


def _facts(st, ids: dict[str, list[str]]) -> dict:
    """Per shard: each stream's kept seqs there (and whether any of its rows is on another shard), its snapshots'
    seqs, the compaction rows recorded there (by stream), and the state a cold load gives."""
    from journal import shards
    from journal.aggregates import cache, load
    from journal.models import Compaction, Event, Snapshot

    cache.clear()
    out = {}
    for alias, names in ids.items():
        for id in names:
            stream = st.stream(id)
            elsewhere = [a for a in shards.shards() if a != alias and _reachable(a)
                         and (Event.objects.using(a).filter(stream_id=stream).exists()
                              or Compaction.objects.using(a).filter(stream_id=stream).exists())]
            agg = load(st, id)
            out[stream] = {
                "shard": alias,
                "seqs": list(Event.objects.using(alias).filter(stream_id=stream).order_by("seq")
                             .values_list("seq", flat=True)),
                "snapshots": list(Snapshot.objects.using(alias).filter(stream_id=stream).order_by("seq")
                                  .values_list("seq", flat=True)),
                "batches": sum(Compaction.objects.using(alias).filter(stream_id=stream)
                               .values_list("events", flat=True)),
                "elsewhere": elsewhere,
                "state": [agg.state.n, agg.state.bumps, agg.version],
            }
    return out


def _reachable(alias: str) -> bool:
    from django.db import OperationalError, connections

    try:
        connections[alias].ensure_connection()
    except OperationalError:
        return False
    return True


def _loom(*args: str) -> list:
    from django.core.management import CommandError, call_command

    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("loom", *args, "--json", stdout=out, stderr=err)
        code = 0
    except CommandError as exc:
        code = exc.returncode
    return [code, json.loads(out.getvalue() or "{}"), err.getvalue()]


def on_shards(arg) -> dict:
    """Two shards: streams of a compacted state on each. (PostgreSQL) the compactor's lock held on shard1 by another
    session: a run compacts default's streams and leaves shard1's (its lock is per shard), then the CLI compacts
    shard1's. Every batch is recorded on the stream's own shard; loads after it equal the loads before; the
    aggregate admin page of a stream on shard1 says where it starts; re-snapshot acts on each stream's shard."""
    from django.contrib.auth import get_user_model
    from django.db import connections
    from django.test import Client

    from journal import compaction, shards
    from journal.models import Snapshot

    st, bump = _declare()
    aliases = shards.shards()
    ids = _ids(arg["run"], 2, aliases)
    _bump(bump, [i for names in ids.values() for i in names], 12)
    out: dict = {"aliases": aliases, "before": _facts(st, ids)}
    second = aliases[1]
    if connections[second].vendor == "postgresql":
        holder = connections.create_connection(second)  # another session of shard1, holding its compactor's lock
        holder.set_autocommit(False)
        with holder.cursor() as cursor:
            cursor.execute(LOCK)
        out["while_locked"], _ = compaction.run_each(aliases)
        holder.rollback()
        holder.close()
        out["after_locked"] = _facts(st, ids)
    out["cli"] = _loom("retention", "compact")[:2]
    out["after"] = _facts(st, ids)
    user, _ = get_user_model().objects.get_or_create(username=f"{arg['run']}-admin", is_staff=True, is_superuser=True)
    client = Client(raise_request_exception=False)
    client.force_login(user)
    page = client.get(f"/admin/journal/aggregatestream/ShardTally/{ids[second][0]}/")
    out["admin"] = [page.status_code, "Compacted before seq 9" in page.content.decode()]
    status = _loom("retention", "status")[1]
    out["status"] = {one["alias"]: sorted({c["stream"] for c in one["compaction"]["compacted"]}) for one in status}

    # re-snapshot over the shards: an old code's snapshot on a stream of each shard that was not compacted
    # (new streams), and on a compacted one of shard1 (refused: it cannot be refolded)
    fresh = _ids(f"{arg['run']}f", 1, aliases)
    _bump(bump, [i for names in fresh.values() for i in names], 7)
    _old_code_snapshots(st, fresh)
    out["resnapshot_fresh"] = _loom("aggregates", "resnapshot", "--state", "ShardTally")[:2]
    compacted = st.stream(ids[second][0])
    with shards.bound(second):
        kept = list(Snapshot.objects.filter(stream_id=compacted).values_list("pk", "state"))
        Snapshot.objects.filter(stream_id=compacted).update(state={"n": 0})
    out["resnapshot_compacted"] = _loom("aggregates", "resnapshot")[:2]
    with shards.bound(second):  # as it was, for the module's next scenario
        for pk, state in kept:
            Snapshot.objects.filter(pk=pk).update(state=state)
    out["fresh"] = _facts(st, fresh)
    out["fresh_snapshots"] = {st.stream(n[0]): list(Snapshot.objects.using(a).filter(stream_id=st.stream(n[0]))
                                                   .order_by("seq").values_list("seq", "state"))
                              for a, n in fresh.items()}
    return out


def shard_down(arg) -> dict:
    """Three shards, the third's server not answering (nothing listens on its port): the CLI compacts default's and
    shard1's streams and exits 4 naming shard2; so does re-snapshot; a worker's retention service compacts the
    reachable shards round after round while shard2 stays down."""
    from django.db import connections
    from django.test import override_settings

    from journal import shards
    from leases.retention import RetentionService

    st, bump = _declare()
    up, down = shards.shards()[:2], shards.shards()[2]
    ids = _ids(arg["run"], 1, up)
    _bump(bump, [i for names in ids.values() for i in names], 12)
    out: dict = {"down": down, "cli": _loom("retention", "compact")[:2], "after_cli": _facts(st, ids),
                 "status": _loom("retention", "status")[:2], "run": _loom("retention", "run")[:2]}
    again = _ids(f"{arg['run']}s", 1, up)
    _bump(bump, [i for names in again.values() for i in names], 12)
    _old_code_snapshots(st, again)
    out["resnapshot"] = _loom("aggregates", "resnapshot", "--state", "ShardTally")[:2]

    later = _ids(f"{arg['run']}w", 1, up)
    _bump(bump, [i for names in later.values() for i in names], 12)
    with override_settings(LOOM_RETENTION_EVERY=0.2):
        service = RetentionService()
        service.start(None)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            facts = _facts(st, later)
            if all(f["seqs"][:1] == [9] for f in facts.values()):
                break
            time.sleep(0.3)
        service.stop(30)
    out["service"] = _facts(st, later)
    out["service_stopped"] = not (service.thread and service.thread.is_alive())
    connections.close_all()
    return out


def main() -> None:
    shard_scenarios.main(globals())


if __name__ == "__main__":
    threading.current_thread().name = "scenario"
    main()
