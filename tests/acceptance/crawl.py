"""The crawl: every URL pattern Django's resolver knows, filled with real ids of the record, requested
as every kind of user. New pages are covered without anyone listing them; a pattern whose parameter
cannot be filled, or a route missing from the access table, fails the sweep."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from django.urls import URLPattern, URLResolver, get_resolver

from utilities.params import AskedQuery

IDENTITIES = ("anonymous", "no role", "auditor", "operator", "ML staff", "admin")
ROLE_OF = {"auditor": "auditor", "operator": "operator", "ML staff": "ml_staff", "admin": "admin"}


@dataclass(frozen=True)
class Route:
    name: str  # namespaced route name, e.g. "compliance:dossier"
    pattern: str  # the full pattern, as the resolver prints it
    params: tuple[str, ...]  # the parameters to fill, in order
    format_suffix: bool  # a DRF `.json` variant of another route

    @property
    def is_api(self) -> bool:
        return self.pattern.startswith("api/")


_NAMED = re.compile(r"<(?:(?P<conv>[^>:]+):)?(?P<name>\w+)>|\(\?P<(?P<rname>\w+)>")


def routes() -> list[Route]:
    """Every route of the project but the admin site's (Django's own, with its own staff login)."""
    found: list[Route] = []

    def walk(patterns, prefix: str, namespace: str | None) -> None:
        for p in patterns:
            if isinstance(p, URLResolver):
                ns = p.namespace or namespace
                if ns == "admin":
                    continue
                walk(p.url_patterns, prefix + str(p.pattern), ns)
            elif isinstance(p, URLPattern):
                full = prefix + str(p.pattern)
                name = f"{namespace}:{p.name}" if namespace else (p.name or full)
                params = tuple(m.group("name") or m.group("rname") for m in _NAMED.finditer(full))
                found.append(Route(name, full, params, "format" in params))

    walk(get_resolver().url_patterns, "", None)
    return found


def fill(route: Route, values: dict[str, str]) -> str:
    """The path of `route` with each parameter replaced by `values[param]` (KeyError if none)."""
    path = route.pattern.replace("<drf_format_suffix:format>", "." + values.get("format", "json"))
    for param in route.params:
        if param == "format" and "(?P<format>" not in path:
            continue
        value = values[param]
        path = re.sub(
            rf"<(?:[^>:]+:)?{param}>|\(\?P<{param}>(?:[^()]|\([^()]*\))*\)",
            lambda _m, v=value: v,
            path,
            count=1,
        )
    path = path.replace("^", "").replace("$", "").replace("\\.", ".").replace("/?", "/")
    return "/" + path


class RecordQueryParameters:
    """Test-only middleware: request.GET as the app's own AskedQuery (utilities.params, which the app
    uses to refuse parameters no view reads), and the names the view asked for (present or not) handed
    back on the response (`response.asked_params`)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        recording = AskedQuery.of(request.GET)
        request.GET = recording
        response = self.get_response(request)
        response.asked_params = recording.asked
        return response


def markdown_table(expected: dict[str, dict[str, int | str]]) -> Iterator[str]:
    yield "| route | " + " | ".join(IDENTITIES) + " |"
    yield "|---|" + "---|" * len(IDENTITIES)
    for name, row in expected.items():
        yield f"| `{name}` | " + " | ".join(str(row[i]) for i in IDENTITIES) + " |"
