"""bench_* commands, their recorded runs and result pages (docs/benchmarks.md)."""

# The face of benchmarks (tests/test_layout.py): the command shape other apps' bench commands build on.
FACE_MODULES = ("benchmarks.command", "benchmarks.sections")
