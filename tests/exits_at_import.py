"""A module that raises SystemExit when imported, like `venv.__main__` (tests/exit_flows.py imports it)."""

raise SystemExit(3)
