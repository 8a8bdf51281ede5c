from django.apps import AppConfig


class ProjectionsConfig(AppConfig):
    name = "projections"
    default_auto_field = "django.db.models.BigAutoField"
