"""The compare page: two to four runs side by side (operations.compare.side_by_side), their differences marked."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from accounts.roles import EVERYONE, role_required
from audit.services import record_viewed
from operations.compare import side_by_side


@role_required(*EVERYONE)
def run_compare(request: HttpRequest) -> HttpResponse:
    """`/runs/compare/?run=12&run=15`. Without a run id: the form that asks for them."""
    ids = side_by_side.run_ids(request.GET)
    if not ids:
        return render(request, "routing/run_compare.html", {"comparison": None, **_limits()})
    runs = side_by_side.runs_for_compare(ids)
    tasks = list({run.task_id: run.task for run in runs}.values())
    for task in tasks:
        record_viewed(request=request, task=task, view="run comparison")
    return render(
        request,
        "routing/run_compare.html",
        {"comparison": side_by_side.compare_runs(runs), "runs": runs, "tasks": tasks, **_limits()},
    )


def _limits() -> dict[str, int]:
    return {"min_runs": side_by_side.MIN_RUNS, "max_runs": side_by_side.MAX_RUNS}
