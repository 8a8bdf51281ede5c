"""A module that must never be imported by the Tasks backend (tests/queues/test_tasks_security.py): importing it
exits the process, as `venv.__main__` did in the issue's report."""

raise SystemExit("tests.task_import_bomb was imported")
