"""The pool's pages: the workers and their provider calls."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from accounts.roles import EVERYONE, role_required
from operations.tasks.filters import FAILED, AttemptFilter
from operations.tasks.pagination import AttemptCursorPagination
from routing import selectors
from routing.models import Attempt
from utilities.pagination import page


@role_required(*EVERYONE)
def attempt_list(request: HttpRequest) -> HttpResponse:
    """Provider calls, filtered: where a symptom on the overview (an error rate, an alert) leads."""
    attempts = AttemptFilter(request.GET, selectors.attempt_list())
    rows, next_page = page(request, attempts.qs, AttemptCursorPagination)
    applied = attempts.form.cleaned_data
    names = ("worker", "vendor", "status", "task", "since", "until")
    return render(
        request,
        "routing/attempt_list.html",
        {
            "attempts": rows,
            "next_page": next_page,
            "workers": selectors.worker_slugs(),
            "vendors": selectors.vendor_names(),
            "statuses": [*Attempt.Status.choices, (FAILED, "Any error")],
            "filters": {name: applied.get(name) or "" for name in names},
            "filtered": [(name, applied[name]) for name in names if applied.get(name)],
        },
    )


@role_required(*EVERYONE)
def worker_list(request: HttpRequest) -> HttpResponse:
    return render(request, "routing/worker_list.html", {"workers": selectors.worker_list()})
