"""Async Django views over the awaitable faces (tests/flows/test_flows_async_faces.py and
tests/queues/test_queues_async.py route to them with @pytest.mark.urls): no sync_to_async anywhere, no database
access on the loop (Django would refuse it: SynchronousOnlyOperation). The API (loomapi) is routed too, under api/."""

from __future__ import annotations

import json

from django.http import JsonResponse
from django.urls import include, path

from journal.flows.aio import adescribe, aget_event, asend, astart
from queues.aio import acancel_pending, aenqueue, aentry_of


async def start_view(request):
    body = json.loads(request.body)
    out = await astart(body["flow"], body["input"], body.get("id"))
    return JsonResponse({"execution_id": out.execution_id, "status": out.status})


async def event_view(request, execution_id: str, key: str):
    value = await aget_event(execution_id, key, timeout=float(request.GET.get("wait", 0)), default=None)
    return JsonResponse({"key": key, "value": value})


async def send_view(request, execution_id: str):
    body = json.loads(request.body)
    return JsonResponse({"message_id": await asend(execution_id, body["topic"], body["payload"], body["id"])})


async def describe_view(request, execution_id: str):
    described = await adescribe(execution_id)
    return JsonResponse({"status": described["status"], "events": len(described["events"])})


async def enqueue_view(request):
    body = json.loads(request.body)
    queued = await aenqueue(body["flow"], body["input"], body.get("queue", "default"), execution_id=body.get("id"))
    return JsonResponse({"execution_id": queued.execution_id, "created": queued.created, "queue": queued.queue})


async def cancel_pending_view(request, execution_id: str):
    return JsonResponse({"cancelled": await acancel_pending(execution_id)})


async def entry_view(request, execution_id: str):
    entry = await aentry_of(execution_id)
    if entry is None:
        return JsonResponse({"entry": None})
    return JsonResponse({"entry": {"state": entry.state, "queue": entry.queue_id, "input": json.loads(entry.input)}})


async def task_view(request):
    """A Django task enqueued from an async view (Task.aenqueue: the backend's aenqueue)."""
    from tests import queue_flows

    body = json.loads(request.body)
    result = await queue_flows.add.aenqueue(*body["args"])
    return JsonResponse({"id": result.id, "status": str(result.status)})


async def task_result_view(request, result_id: str):
    """A task's result read from an async view twice: Task.aget_result, then TaskResult.arefresh."""
    from tests import queue_flows

    result = await queue_flows.add.aget_result(result_id)
    await result.arefresh()
    value = result.return_value if result.is_finished and str(result.status) == "SUCCESSFUL" else None
    return JsonResponse({"status": str(result.status), "value": value, "errors": len(result.errors)})


urlpatterns = [
    path("enqueue", enqueue_view),
    path("cancel-pending/<str:execution_id>", cancel_pending_view),
    path("entry/<str:execution_id>", entry_view),
    path("task", task_view),
    path("task/<str:result_id>", task_result_view),
    path("api/", include("loomapi.urls")),
    path("start", start_view),
    path("event/<str:execution_id>/<str:key>", event_view),
    path("send/<str:execution_id>", send_view),
    path("describe/<str:execution_id>", describe_view),
]
