"""One error shape for the whole REST API, and the schema that documents it.

Every error answer is `{"detail": "<a sentence>"}`; a validation error adds `"errors"`: the messages
of each field that was refused (nested fields as dotted names: `reward.correctness`, `items.0`).
`api_exception_handler` (REST_FRAMEWORK["EXCEPTION_HANDLER"]) gives DRF's errors that shape; views
that answer an error themselves write `{"detail": ...}`. `error_responses_postprocess` (a
drf-spectacular postprocessing hook) declares, on every operation, the error statuses it can answer,
all referring to the one `Error` component.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from rest_framework import exceptions
from rest_framework.settings import api_settings
from rest_framework.views import exception_handler

from routing.errors import ServiceError

ERROR_COMPONENT = "Error"
ERROR_REF = {"$ref": f"#/components/schemas/{ERROR_COMPONENT}"}
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Why the request was refused.",
    "properties": {
        "detail": {"type": "string", "description": "What went wrong, in a sentence"},
        "errors": {
            "type": "object",
            "description": "Validation errors only: the messages for each refused field (nested fields "
            "as dotted names; errors of the whole body under non_field_errors)",
            "additionalProperties": {"type": "array", "items": {"type": "string"}},
        },
    },
    "required": ["detail"],
}


# --- the exception handler -------------------------------------------------------------------------


class Refused(exceptions.APIException):
    """A service's refusal (routing.errors.ServiceError) as an API error with the service's status."""

    def __init__(self, exc: ServiceError):
        self.status_code = exc.status
        super().__init__(detail=str(exc))


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Any:
    """DRF's handler (status, headers such as Allow and Retry-After), with the body in the one shape.
    A service's refusal (ServiceError, any app) is answered with its sentence and status."""
    if isinstance(exc, ServiceError):
        exc = Refused(exc)
    response = exception_handler(exc, context)
    if response is None:
        return None  # not an API error: Django answers it (a 500)
    response.data = error_body(exc, response.data)
    return response


def error_body(exc: Exception, data: Any) -> dict[str, Any]:
    if isinstance(exc, exceptions.ValidationError) or not _is_detail_only(data):
        errors = field_errors(data)
        return {"detail": _sentence(errors), "errors": errors}
    return {"detail": str(data["detail"])}


def _is_detail_only(data: Any) -> bool:
    return isinstance(data, dict) and set(data) == {"detail"} and not isinstance(data["detail"], dict | list)


def field_errors(detail: Any, prefix: str = "") -> dict[str, list[str]]:
    """DRF's nested error detail as {field: [messages]}, nested fields under dotted names."""
    here = prefix or api_settings.NON_FIELD_ERRORS_KEY
    if isinstance(detail, dict):
        parts = [
            (here if key == api_settings.NON_FIELD_ERRORS_KEY else _child(prefix, key), value)
            for key, value in detail.items()
        ]
    elif isinstance(detail, list | tuple):
        # This field's messages; or, for a list of objects or a list field's items, each one's errors.
        parts = [
            (_child(prefix, index) if isinstance(item, dict | list | tuple) else here, item)
            for index, item in enumerate(detail)
        ]
    else:
        return {here: [str(detail)]}
    errors: dict[str, list[str]] = {}
    for name, value in parts:
        nested = field_errors(value, name) if isinstance(value, dict | list | tuple) else {name: [str(value)]}
        for field, messages in nested.items():
            errors.setdefault(field, []).extend(messages)
    return errors


def _child(prefix: str, key: object) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


def _sentence(errors: dict[str, list[str]]) -> str:
    parts = [
        " ".join(messages) if field == api_settings.NON_FIELD_ERRORS_KEY else f"{field}: {' '.join(messages)}"
        for field, messages in errors.items()
    ]
    return "Invalid input: " + ("; ".join(parts) if parts else "the request was refused.")


# --- the schema ------------------------------------------------------------------------------------

DESCRIPTIONS = {
    400: "Invalid input (errors says which fields and why), or a request the service refused",
    401: "Not authenticated: no valid session or token",
    403: "Not signed in, or your role does not allow this",
    404: "No such object (or an invalid page cursor)",
    405: "This method is not allowed here; the Allow header lists those that are",
    406: "None of the media types the Accept header asks for can be produced",
    409: "Conflicts with an earlier request",
    413: "The body is over the size limit (DATA_UPLOAD_MAX_MEMORY_SIZE)",
    415: "The body's media type is not one this operation reads",
    429: "Too many requests; the Retry-After header says when to try again",
}
HTTP_METHODS = {"get", "put", "post", "delete", "patch"}
PATH_PARAMETER = re.compile(r"{[^}]+}")


def _statuses(path: str, operation: dict[str, Any], throttled: bool, methods: set[str]) -> set[int]:
    query = {p.get("name") for p in operation.get("parameters", []) if p.get("in") == "query"}
    has_body = "requestBody" in operation
    statuses = {406}
    if has_body or query:
        statuses.add(400)
    if has_body:
        statuses |= {413, 415}
    security = operation.get("security")
    if security and {} not in security:
        statuses |= {401, 403}
    if PATH_PARAMETER.search(path) or "cursor" in query:
        statuses.add(404)
    if HTTP_METHODS - methods:
        statuses.add(405)
    if throttled:
        statuses.add(429)
    return statuses


def _throttled_operations(generator: Any) -> set[tuple[str, str]]:
    throttled = set()
    for path, _regex, method, callback in generator.endpoints or []:
        view_class = getattr(callback, "cls", None)
        classes = getattr(callback, "initkwargs", {}).get(
            "throttle_classes", getattr(view_class, "throttle_classes", ())
        )
        if classes:
            throttled.add((path, method.lower()))
    return throttled


def error_responses_postprocess(result: dict[str, Any], generator: Any, **kwargs: Any) -> dict[str, Any]:
    """Declare, on every operation, the error statuses it can answer, each with the Error schema.

    400 where there is a body or query parameters, 401/403 where authentication is required, 404 on
    detail routes (and a list's invalid cursor), 405 on paths that do not take every method, 406
    everywhere, 413 and 415 where there is a body, 429 where the view is throttled. Errors a view declared
    itself (409 for a conflict, say) keep their description and get the Error schema too.
    """
    components = result.setdefault("components", {}).setdefault("schemas", {})
    components[ERROR_COMPONENT] = copy.deepcopy(ERROR_SCHEMA)
    throttled = _throttled_operations(generator)
    for path, item in result.get("paths", {}).items():
        methods = {m for m in item if m in HTTP_METHODS}
        for method in methods:
            operation = item[method]
            responses = operation.setdefault("responses", {})
            for code in _statuses(path, operation, (path, method) in throttled, methods):
                responses.setdefault(str(code), {"description": DESCRIPTIONS[code]})
            for code, response in responses.items():
                if str(code).startswith("4"):
                    response["content"] = {"application/json": {"schema": dict(ERROR_REF)}}
                    if not response.get("description"):
                        response["description"] = DESCRIPTIONS.get(int(code), "")
            operation["responses"] = dict(sorted(responses.items()))
    return result
