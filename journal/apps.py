from django.apps import AppConfig


class JournalConfig(AppConfig):
    name = "journal"
    verbose_name = "Loom journal"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from journal import checks  # noqa: F401  (registers the system checks)
