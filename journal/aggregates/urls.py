"""The aggregate admin pages at a URL of the project's choosing (loomsite mounts them at /admin/aggregates/).

Not needed: the same pages are registered with the admin site (journal/admin.py, the AggregateStream
proxy) at /admin/journal/aggregatestream/ and linked from the admin index. Same permission either way.
"""

from django.urls import path

from journal.aggregates.admin import urlpatterns_views as views

app_name = "aggregates"

urlpatterns = [
    path("", views["index"], name="index"),
    path("<str:state>/", views["streams"], name="streams"),
    path("<str:state>/<path:id>/", views["detail"], name="detail"),
]
