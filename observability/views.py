"""/metrics for Prometheus: the record's own figures (observability.metrics, from PostgreSQL at scrape
time, so every process's work counts) and django-prometheus' request metrics of this web process.

Guarded as configured: with `CONDUCTOR_METRICS_TOKEN` set, a scrape sends it as a bearer token (401
without it); without a token, only loopback addresses may scrape (403 otherwise)."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from observability.metrics import RecordCollector

LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


def _allowed(request: HttpRequest) -> HttpResponse | None:
    token = settings.METRICS_TOKEN
    if token:
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            response = HttpResponse("a metrics token is required\n", status=401, content_type="text/plain")
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
            return response
    elif request.META.get("REMOTE_ADDR") not in LOOPBACK:
        return HttpResponse(
            "metrics are served to loopback addresses only (set CONDUCTOR_METRICS_TOKEN to scrape from elsewhere)\n",
            status=403,
            content_type="text/plain",
        )
    return None


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    refused = _allowed(request)
    if refused is not None:
        return refused
    record = CollectorRegistry(auto_describe=False)
    record.register(RecordCollector())
    body = generate_latest(REGISTRY) + generate_latest(record)
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
