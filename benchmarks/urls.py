"""Result pages of recorded benchmark runs (see docs/results.md)."""

from django.urls import path

from benchmarks import views

app_name = "benchmarks"

urlpatterns = [
    path("", views.run_list, name="run_list"),
    path("runs/<int:pk>/", views.run_detail, name="run_detail"),
    path("runs/<int:pk>.csv", views.run_csv, name="run_csv"),
    path("runs/<int:pk>.json", views.run_json, name="run_json"),
    path("compare/", views.compare_runs, name="compare_form"),
    path("compare/<int:base>/<int:new>/", views.compare_runs, name="compare"),
    path("compare/<int:base>/<int:new>.csv", views.compare_csv, name="compare_csv"),
]
