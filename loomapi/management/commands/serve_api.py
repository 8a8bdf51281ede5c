"""`manage.py serve_api`: the old name of `loom_serve_api` (docs/http-api.md). It still runs `loom_serve_api`
for one release, after a deprecation warning on stderr that names the new command; it goes in 0.3."""

from __future__ import annotations

from loomapi.management.commands.loom_serve_api import Command as LoomServeApi

WARNING = "`manage.py serve_api` is deprecated and goes in 0.3: run `manage.py loom_serve_api` (the same command)"


class Command(LoomServeApi):
    help = f"Deprecated alias of loom_serve_api (goes in 0.3). {LoomServeApi.help}"

    def handle(self, *args, **options) -> None:
        self.stderr.write(self.style.WARNING(WARNING))
        return super().handle(*args, **options)
