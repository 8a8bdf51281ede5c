"""`manage.py drain`: the old name of `loom_drain` (docs/projections.md). It still runs `loom_drain` for one
release, after a deprecation warning on stderr that names the new command; it goes in 0.3."""

from __future__ import annotations

from projections.management.commands.loom_drain import Command as LoomDrain

WARNING = "`manage.py drain` is deprecated and goes in 0.3: run `manage.py loom_drain` (the same command)"


class Command(LoomDrain):
    help = f"Deprecated alias of loom_drain (goes in 0.3). {LoomDrain.help}"

    def handle(self, *args, **options) -> None:
        self.stderr.write(self.style.WARNING(WARNING))
        return super().handle(*args, **options)
