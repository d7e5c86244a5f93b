"""The analytics page and its charts as CSV (operations.analytics.figures)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from accounts.roles import EVERYONE, role_required
from routing import selectors
from routing.models import DataClass
from utilities import params

from . import figures

ANALYTICS_CHARTS = {
    "cost_by_worker": lambda f: figures.cost_over_time(f, by="worker"),
    "cost_by_vendor": lambda f: figures.cost_over_time(f, by="vendor"),
    "cost_by_conductor": lambda f: figures.cost_over_time(f, by="conductor"),
    "accuracy_cost_workers": lambda f: figures.accuracy_vs_cost(f, by="worker"),
    "accuracy_cost_conductors": lambda f: figures.accuracy_vs_cost(f, by="conductor"),
    "routing_by_domain": figures.routing_distribution,
}


@role_required(*EVERYONE)
def analytics_page(request: HttpRequest) -> HttpResponse:
    base = figures.default_filters(days=7)
    since, until = params.period(request.GET)
    conductors = selectors.conductor_names()
    filters = figures.Filters(
        since=since or base.since,
        until=until or base.until,
        classification=params.choice(request.GET, "classification", DataClass.values),
        conductor=params.choice(request.GET, "conductor", conductors),
        bucket=params.choice(request.GET, "bucket", figures.BUCKETS),
    )
    bucket = figures.bucket_name(filters)  # a bucket that does not fit the period: refused here
    chart = params.choice(request.GET, "chart", ANALYTICS_CHARTS)
    if chart:
        response = HttpResponse(figures.as_csv(ANALYTICS_CHARTS[chart](filters)), content_type="text/csv")
        response["Content-Disposition"] = f'attachment; filename="{chart}.csv"'
        return response
    data = {name: build(filters) for name, build in ANALYTICS_CHARTS.items()}
    return render(
        request,
        "routing/analytics.html",
        {
            "data": data,
            "bucket_s": figures.bucket_seconds(filters),
            "bucket_label": figures.BUCKETS[bucket][0],
            "buckets": [(name, label) for name, (label, _, _) in figures.BUCKETS.items()],
            "filters": filters,
            "classes": DataClass.choices,
            "conductors": conductors,
            "query": request.GET.urlencode(),
        },
    )
