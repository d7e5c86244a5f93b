"""The live overview's page (operations.overview.figures)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from accounts.roles import EVERYONE, role_required
from utilities import params

from . import figures


@role_required(*EVERYONE)
def ops_overview(request: HttpRequest) -> HttpResponse:
    minutes = params.integer(request.GET, "minutes", default=15, minimum=1, maximum=24 * 60)
    period = params.choice(request.GET, "period", figures.PERIODS) or "hour"
    context = {
        "data": figures.overview(minutes=minutes),
        "history": figures.history(period),
        "period": period,
        "periods": list(figures.PERIODS),
        "queues": figures.queue_depths(),
        "workers_alive": figures.workers_alive(),
        "local_model": figures.local_model_state(),
    }
    template = "routing/_ops_body.html" if request.GET.get("partial") else "routing/ops.html"
    return render(request, template, context)
