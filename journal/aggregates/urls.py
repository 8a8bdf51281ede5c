"""URLs of the aggregate admin pages; a project mounts them at /admin/aggregates/ (see docs/aggregates.md)."""

from django.urls import path

from journal.aggregates.admin import urlpatterns_views as views

app_name = "aggregates"

urlpatterns = [
    path("", views["index"], name="index"),
    path("<str:state>/", views["streams"], name="streams"),
    path("<str:state>/<path:id>/", views["detail"], name="detail"),
]
