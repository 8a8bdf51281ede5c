"""Async Django views over the awaitable faces (tests/flows/test_flows_async_faces.py routes to them with
@pytest.mark.urls): no sync_to_async anywhere, no database access on the loop (Django would refuse it)."""

from __future__ import annotations

import json

from django.http import JsonResponse
from django.urls import path

from journal.flows.aio import adescribe, aget_event, asend, astart


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


urlpatterns = [
    path("start", start_view),
    path("event/<str:execution_id>/<str:key>", event_view),
    path("send/<str:execution_id>", send_view),
    path("describe/<str:execution_id>", describe_view),
]
