"""The API's routes, mounted by the embedding project under a prefix of its choice:

    path("api/", include("loomapi.urls"))
    handler400 = "loomapi.views.bad_request"   # JSON 400s under the prefix (a disallowed Host, say)
"""

from django.urls import path

from loomapi import views

app_name = "loomapi"

urlpatterns = [
    path("health", views.health, name="health"),
    path("metrics", views.metrics, name="metrics"),
    path("flows/<str:name>/call", views.call, name="call"),
    path("flows/<str:name>/executions", views.start_execution, name="start"),
    path("executions", views.list_executions, name="list"),
    path("executions/<path:execution_id>/retry", views.retry_execution, name="retry"),
    path("executions/<path:execution_id>/cancel", views.cancel_execution, name="cancel"),
    path("executions/<path:execution_id>/messages", views.send_message, name="messages"),
    path("executions/<path:execution_id>/events/<str:key>", views.get_event, name="event"),
    path("executions/<path:execution_id>", views.execution, name="execution"),
    path("<path:rest>", views.not_found),
    path("", views.not_found),
]
