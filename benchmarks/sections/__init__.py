"""The sections of every bench command, by name: each is a module with `run(ctx)` (and optionally
`add_arguments(parser)`); a command is a `BenchCommand` listing one of these maps (benchmarks/command.py).

Shared by the sections: benchmarks/cells.py (a cell's prologue and verify tail), benchmarks/harness.py
(workers, statement counting), benchmarks/children.py (child processes on the run's database),
benchmarks/domains/ (the example aggregate domains, shared with the tests).
"""

THROUGHPUT_SECTIONS: dict[str, str] = {
    "append": "benchmarks.sections.append",
    "coalesced": "benchmarks.sections.coalesced",
    "batch-shape": "benchmarks.sections.batch_shape",
    "notify": "benchmarks.sections.notify",
    "fanout": "benchmarks.sections.fanout",
    "executions": "benchmarks.sections.executions",
    "effect-sweep": "benchmarks.sections.effect_sweep",
    "durable": "benchmarks.sections.durable",
    "transient": "benchmarks.sections.transient",
    "read": "benchmarks.sections.read",
    "lease": "benchmarks.sections.lease",  # short version; the full method is `manage.py bench_lease`
    "peers": "benchmarks.sections.peers",  # eventsourcing and DBOS beside us (optional extra `peers`)
    "shards": "benchmarks.sections.shards",  # 1 vs 2 PostgreSQL servers, PgBouncer vs direct (docs/scaling.md)
    "growth": "benchmarks.sections.growth",  # per-op cost as the journal grows (pre-filled 10^5..10^7)
}

LEASE_SECTIONS: dict[str, str] = {"lease": "benchmarks.sections.lease"}

REACTION_SECTIONS: dict[str, str] = {
    "latency": "benchmarks.sections.reactions.latency",
    "contention": "benchmarks.sections.reactions.contention",
    "watermark": "benchmarks.sections.reactions.watermark",
    "replay": "benchmarks.sections.reactions.replay",
    "lanes": "benchmarks.sections.reactions.lanes",
}

AGGREGATE_SECTIONS: dict[str, str] = {"aggregates": "benchmarks.sections.aggregates"}

# bench_http's section measures the HTTP API (loomapi, the floor below benchmarks: docs/architecture.md).
HTTP_SECTIONS: dict[str, str] = {"http": "benchmarks.sections.http"}

QUEUE_SECTIONS: dict[str, str] = {"queues": "benchmarks.sections.queues"}

SCHEDULE_SECTIONS: dict[str, str] = {"schedules": "benchmarks.sections.schedules"}

# Sections of `manage.py bench_privacy` (personal data: sealed fields, forget, the content store; docs/privacy.md).
PRIVACY_SECTIONS: dict[str, str] = {"privacy": "benchmarks.sections.privacy"}

# Sections of `manage.py bench_waits` (flows that wait, issue 17): each wakes its flows with a real loom_worker.
WAITS_SECTIONS: dict[str, str] = {
    "timers": "benchmarks.sections.waits_timers",
    "messages": "benchmarks.sections.waits_messages",
    "idle": "benchmarks.sections.waits_idle",
}
