"""The site's error answers (Django's handler400/404/500): under /api/ they are JSON in the API's one
error shape (conductor_web.api_errors), as DRF answers its own errors; elsewhere the pages.

DRF answers the errors a view raises. These cover what no view answers: a path no route matches (an
id that is not one), and a request Django refuses before the view reads it (a body over
DATA_UPLOAD_MAX_MEMORY_SIZE, which answers 413 with the limit).
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
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
