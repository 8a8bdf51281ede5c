"""The demo site as an app, only so that its system checks are registered (loomsite/checks.py)."""

from django.apps import AppConfig


class LoomsiteConfig(AppConfig):
    name = "loomsite"
    verbose_name = "Loom demo site"

    def ready(self) -> None:
        from loomsite import checks  # noqa: F401  (registers the checks)
