from django.apps import AppConfig


class LoomApiConfig(AppConfig):
    name = "loomapi"
    verbose_name = "Loom HTTP API"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from loomapi import checks, conf  # noqa: F401  (registers the system checks and the LOOM_API_* settings)

        if conf.get_safe("LOOM_API_EXAMPLES", False):
            # Registering flows is what importing their module does (like admin.autodiscover).
            from loomapi import examples  # noqa: F401
