"""Sections of `manage.py bench_throughput`, by name. Each module has `run(ctx)`."""

THROUGHPUT_SECTIONS: dict[str, str] = {
    "append": "benchmarks.sections.append",
}
