"""Requests that cannot be read as asked get a 400 with the reason, never a 500 or a silent guess.

- A query string with a NUL byte or bytes that are not UTF-8 is refused before any view runs: no
  filter can hold it (PostgreSQL text cannot hold NUL) and decoding it would alter what was asked.
- So is a form body that is not valid UTF-8, or holds a NUL byte: never stored with replacement
  characters, never a database error.
- A page that raises utilities.params.InvalidParameter (a filter it cannot apply) renders the reason
  with the status 400. The REST API answers those itself (they are DRF parse errors).
- A GET (or HEAD) whose query holds a parameter the page or endpoint never asked for (a misspelt
  filter, one another page reads) is refused the same way, naming it (utilities.params.AskedQuery):
  its answer is replaced by the 400 before it is sent. A GET changes nothing but the audit record of
  who viewed or exported what, so only such an event, written by the view, outlives the refusal. The
  admin site, which reads its changelist's query whole, is left to Django.

Django decodes form bodies leniently: percent-escapes of invalid bytes become U+FFFD, raw non-ASCII
bytes are read as Latin-1, and multipart fields are decoded with errors="replace". A task submitted
that way would be stored altered, with a 201 or a redirect. So the raw body is checked before any
view (or the CSRF check, which reads the parsed form) runs. JSON bodies need no check here: the API's
JSON parser decodes strictly and answers a 400 itself.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable
from urllib.parse import unquote_to_bytes

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.http.multipartparser import MultiPartParserError
from django.template.response import TemplateResponse

from utilities.params import AskedQuery, InvalidParameter, unknown_message

FORM = "application/x-www-form-urlencoded"
MULTIPART = "multipart/form-data"
METHODS_WITH_BODY = {"POST", "PUT", "PATCH", "DELETE"}
READS = {"GET", "HEAD"}
UNCHECKED_NAMESPACES = {"admin"}  # Django's admin site reads its changelist's query whole
REPLACEMENT = "\ufffd"


def _percent_decoded(part: str | bytes) -> str:
    """A query string or url-encoded form part as Django reads it, decoded strictly (UnicodeDecodeError)."""
    plus, space = ("+", " ") if isinstance(part, str) else (b"+", b" ")
    return unquote_to_bytes(part.replace(plus, space)).decode("utf-8")  # type: ignore[arg-type]


def query_string_problem(raw: str) -> str | None:
    try:
        decoded = _percent_decoded(raw)
    except UnicodeDecodeError:
        return "the query string is not valid UTF-8"
    if "\x00" in decoded:
        return "the query string contains a NUL byte"
    return None


def _message(field: str) -> str:
    return f"The form field {field!r} is not valid UTF-8: send the form encoded as UTF-8."


def _nul_message(field: str) -> str:
    return f"The form field {field!r} contains a NUL byte, which no text can hold."


def urlencoded_problem(body: bytes) -> str | None:
    """The first field whose name or value, percent-decoded, is not UTF-8 (Django decodes forms as UTF-8)."""
    for pair in body.split(b"&"):
        name, _, value = pair.partition(b"=")
        for part in (name, value):
            try:
                decoded = _percent_decoded(part)
            except UnicodeDecodeError:
                return _message(unquote_to_bytes(name.replace(b"+", b" ")).decode("utf-8", "replace"))
            if "\x00" in decoded:
                return _nul_message(unquote_to_bytes(name.replace(b"+", b" ")).decode("utf-8", "replace"))
    return None


def multipart_problem(request: HttpRequest, body: bytes) -> str | None:
    """A field holding more U+FFFD than the raw body does: Django put them there for invalid bytes."""
    try:
        fields = list(request.POST.lists())
    except MultiPartParserError:
        return None  # malformed; what reads the form answers that
    sent = body.count(REPLACEMENT.encode())
    seen = 0
    first = None
    for name, values in fields:
        if "\x00" in name or any("\x00" in value for value in values):
            return _nul_message(name)
        count = name.count(REPLACEMENT) + sum(value.count(REPLACEMENT) for value in values)
        if count and first is None:
            first = name
        seen += count
    return _message(first) if seen > sent and first is not None else None


def body_problem(request: HttpRequest) -> str | None:
    if request.method not in METHODS_WITH_BODY or request.content_type not in (FORM, MULTIPART):
        return None
    try:
        charset = codecs.lookup(request.encoding or settings.DEFAULT_CHARSET).name
    except LookupError:
        return None  # an unknown charset: what reads the body refuses it
    if charset != "utf-8":
        return None  # decoded in the charset it declares (a form body in another one: Django refuses it)
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return None
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    if length == 0 or (limit is not None and length > limit):
        return None  # nothing to read, or too large to read here: Django refuses or streams it
    if request.content_type == FORM:
        return urlencoded_problem(request.body)
    if request.method == "POST":  # Django parses multipart forms of POST requests only
        return multipart_problem(request, request.body)
    return None


def wants_json(request: HttpRequest) -> bool:
    """The API, a .json path, or a client that asks for JSON: answered in JSON, errors included."""
    return (
        request.path.startswith("/api/")
        or request.path.endswith(".json")
        or "application/json" in request.headers.get("Accept", "")
    )


def bad_request(request: HttpRequest, message: str, status: int = 400) -> HttpResponse:
    if wants_json(request):
        return JsonResponse({"detail": message}, status=status)
    response = TemplateResponse(request, "400.html", {"message": message}, status=status)
    return response.render()


def _answered_from_its_query(request: HttpRequest, response: HttpResponse) -> bool:
    """An answer (2xx: not a redirect, such as the login page's, nor an error) of a view held to the
    query rule."""
    match = getattr(request, "resolver_match", None)
    return 200 <= response.status_code < 300 and not (match and match.namespace in UNCHECKED_NAMESPACES)


class BadRequestMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        problem = query_string_problem(request.META.get("QUERY_STRING", "")) or body_problem(request)
        if problem:
            return bad_request(request, problem)
        if request.method not in READS or not request.GET:
            return self.get_response(request)
        query = request.GET if isinstance(request.GET, AskedQuery) else AskedQuery.of(request.GET)
        request.GET = query
        response = self.get_response(request)
        unknown = query.unasked() if _answered_from_its_query(request, response) else []
        if unknown:
            # The view's answer is dropped unsent (a streamed export's generator never starts); not
            # closed here: close() signals the request's end, and Django closes its database connection.
            return bad_request(request, unknown_message(unknown, query.asked, request.path))
        return response

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if isinstance(exception, InvalidParameter):
            return bad_request(request, str(exception.detail))
        return None
