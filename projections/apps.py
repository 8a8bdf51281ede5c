from contextlib import suppress
from importlib import import_module

from django.apps import AppConfig, apps


class ProjectionsConfig(AppConfig):
    name = "projections"
    verbose_name = "Loom reactions and projections"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from projections import checks, conf  # noqa: F401  (registers the system checks and the settings)

        for module in conf.get_safe("LOOM_PROJECTION_MODULES", []):
            with suppress(ImportError):  # reported by the system check loom.E401 (was loom.E004, projections.E001)
                import_module(module)
        from journal.telemetry import add_gauge_source
        from projections.telemetry import gauges

        add_gauge_source(gauges)  # projection lag on the metrics page (docs/observability.md)
        if apps.is_installed("leases"):
            from leases.worker import register_service
            from projections.service import DrainService

            register_service(DrainService)
