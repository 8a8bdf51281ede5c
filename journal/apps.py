from django.apps import AppConfig


class JournalConfig(AppConfig):
    name = "journal"
    verbose_name = "Loom journal"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from journal import checks  # noqa: F401  (registers the system checks)
        from journal.conf import get_safe
        from journal.flows.registry import flow_module_problems

        # Flows register themselves when their module is imported; a worker that resumes an
        # execution must know its flow, so the modules listed here are imported at start-up.
        # A module that cannot be imported is reported by the system check loom.E003.
        flow_module_problems(get_safe("LOOM_FLOW_MODULES", []))
        from journal import telemetry

        telemetry.configure()  # traces, metrics (LOOM_TRACES, LOOM_METRICS): nothing unless configured
