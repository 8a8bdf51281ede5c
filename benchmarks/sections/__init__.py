"""Sections of `manage.py bench_throughput`, by name. Each module has `run(ctx)`."""

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
}
