"""`manage.py drain`: the old name of `loom_drain` (docs/projections.md), kept as an alias."""

from projections.management.commands.loom_drain import Command  # noqa: F401
