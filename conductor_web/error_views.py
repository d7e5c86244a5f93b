"""The site's error answers (Django's handler400/404/500): under /api/ they are JSON in the API's one
error shape (conductor_web.api_errors), as DRF answers its own errors; elsewhere the pages.

DRF answers the errors a view raises. These cover what no view answers: a path no route matches (an
id that is not one), a request Django refuses before the view reads it (a body over
DATA_UPLOAD_MAX_MEMORY_SIZE, which answers 413 with the limit), and an error status answered with no
body at all (require_POST's 405): ErrorPageMiddleware gives it a page, or the API's shape.
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.response import TemplateResponse
from django.views import defaults

from .middleware import bad_request as refused
from .middleware import wants_json


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    if isinstance(exception, RequestDataTooBig):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return refused(request, f"The request body is over the limit of {limit:,} bytes.", status=413)
    return refused(request, "The request was malformed.")


def page_not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    if wants_json(request):
        return JsonResponse({"detail": f"There is nothing at {request.path}."}, status=404)
    return defaults.page_not_found(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    if wants_json(request):
        return JsonResponse({"detail": "The server failed to answer; the error is in its log."}, status=500)
    return defaults.server_error(request)


def _sentence(request: HttpRequest, response: HttpResponse) -> str:
    if response.status_code == 405:
        allowed = response.get("Allow", "")
        takes = f"it takes {allowed} only" if allowed else "it takes no method"
        return f"{request.method} is not allowed at {request.path}; {takes}."
    return f"The request was answered {response.status_code} {response.reason_phrase}."


class ErrorPageMiddleware:
    """An error status answered with an empty body (Django's require_POST and View's 405, a bare
    HttpResponse(status=...)) gets the site's error page, or `{"detail": ...}` for the API and JSON
    clients; its status and headers (Allow, Retry-After) are kept. An answer that has a body is its
    own explanation and is left as it is."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if response.status_code < 400 or response.streaming or response.content:
            return response
        sentence = _sentence(request, response)
        if wants_json(request):
            page: HttpResponse = JsonResponse({"detail": sentence}, status=response.status_code)
        else:
            context = {"status": response.status_code, "reason": response.reason_phrase, "message": sentence}
            page = TemplateResponse(request, "error.html", context, status=response.status_code).render()
        for header, value in response.headers.items():
            if header.lower() not in ("content-type", "content-length"):
                page[header] = value
        return page
