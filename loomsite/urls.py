"""URLs of the hosting project: the admin, the benchmark result pages, the API."""

from django.conf import settings
from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

urlpatterns = [
    path("", RedirectView.as_view(url="/bench/", permanent=False)),
    path("admin/aggregates/", include("journal.aggregates.urls")),
    path("admin/", admin.site.urls),
    path("bench/", include("benchmarks.urls")),
    path("api/", include("loomapi.urls")),
]

# A disallowed Host (and any other 400 Django raises before a view) answers JSON under api/.
handler400 = "loomapi.views.bad_request"

if settings.DEBUG and "debug_toolbar" in settings.INSTALLED_APPS:
    urlpatterns.append(path("__debug__/", include("debug_toolbar.urls")))
