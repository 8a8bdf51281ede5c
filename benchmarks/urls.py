"""Result pages of recorded benchmark runs (filled in by benchmarks/views.py)."""

from django.urls import path

from benchmarks import views

app_name = "benchmarks"

urlpatterns = [
    path("", views.run_list, name="run_list"),
    path("runs/<int:pk>/", views.run_detail, name="run_detail"),
]
