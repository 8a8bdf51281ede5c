"""`manage.py serve_api`: the old name of `loom_serve_api` (docs/http-api.md), kept as an alias."""

from loomapi.management.commands.loom_serve_api import Command  # noqa: F401
