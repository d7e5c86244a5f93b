"""Requests that cannot be read as asked get a 400 with the reason, never a 500 or a silent guess.

- A query string with a NUL byte or bytes that are not UTF-8 is refused before any view runs: no
  filter can hold it (PostgreSQL text cannot hold NUL) and decoding it would alter what was asked.
- A page that raises audit.params.InvalidParameter (a filter it cannot apply) renders the reason
  with the status 400. The REST API answers those itself (they are DRF parse errors).
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import unquote_to_bytes

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.response import TemplateResponse

from audit.params import InvalidParameter


def query_string_problem(raw: str) -> str | None:
    try:
        decoded = unquote_to_bytes(raw.replace("+", " ")).decode("utf-8")
    except UnicodeDecodeError:
        return "the query string is not valid UTF-8"
    if "\x00" in decoded:
        return "the query string contains a NUL byte"
    return None


def bad_request(request: HttpRequest, message: str) -> HttpResponse:
    wants_json = request.path.endswith(".json") or "application/json" in request.headers.get("Accept", "")
    if request.path.startswith("/api/") or wants_json:
        return JsonResponse({"detail": message}, status=400)
    response = TemplateResponse(request, "400.html", {"message": message}, status=400)
    return response.render()


class BadRequestMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        problem = query_string_problem(request.META.get("QUERY_STRING", ""))
        if problem:
            return bad_request(request, problem)
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if isinstance(exception, InvalidParameter):
            return bad_request(request, str(exception.detail))
        return None
