"""Hostile query strings answered with 400 before any view (or the database) sees them.

Generic guards for every page of the site, the admin's list filters included:

- A NUL character in the query string: PostgreSQL refuses NUL inside text ("A string literal cannot
  contain NUL"), so a filter such as `?command=%00` or `?type=%00` would surface as a 500.
- An admin list whose filters overflow a date (`?started_at__year=9999` makes the date hierarchy ask for
  year 10000) or an integer column: Django raises OverflowError/ValueError from the changelist; that is
  the client's bad input, answered 400, not a server error.

Under the API's mount (`/api/`) the answer is the API's JSON error shape (loomapi/errors.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse

logger = logging.getLogger("loomsite")

API_PREFIX = "/api/"


def bad_request(request: HttpRequest, message: str) -> HttpResponse:
    if request.path.startswith(API_PREFIX):
        return JsonResponse({"error": {"code": "bad_request", "message": message, "id": None}}, status=400)
    return HttpResponseBadRequest(message, content_type="text/plain; charset=utf-8")


class HostileQueryMiddleware:
    """Refuse NUL in query strings; turn overflowing admin list filters into a 400."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if any("\x00" in key or any("\x00" in v for v in values) for key, values in request.GET.lists()):
            return bad_request(request, "the query string contains a NUL character")
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        match = request.resolver_match
        if (isinstance(exception, (OverflowError, ValueError)) and request.method in ("GET", "HEAD") and request.GET
                and match is not None and match.url_name and match.url_name.endswith("_changelist")):
            logger.warning("admin list %s refused a filter: %s: %s", request.path, type(exception).__name__,
                           exception)
            return bad_request(request, f"a filter value is out of range: {exception}")
        return None
