from django.apps import AppConfig


class BenchmarksConfig(AppConfig):
    name = "benchmarks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from benchmarks import conf  # noqa: F401  (registers LOOM_RESULTS_PUBLIC)
