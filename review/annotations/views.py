"""The reviewers' pages: the review queue, and recording a verdict from a task's page."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from accounts.roles import role_required
from review.annotations import services as review
from routing import selectors
from routing.models import Annotation, Run
from utilities import params
from utilities.pagination import StrictCursorPagination, page


class QueueCursorPagination(StrictCursorPagination):
    """Ended runs, the newest first."""

    ordering = ("-id",)
    page_size = 50


@role_required(*review.REVIEWERS)
def review_queue(request: HttpRequest) -> HttpResponse:
    verdict = params.choice(request.GET, "verdict", Annotation.Verdict.values)
    filters = {
        # A verdict asked for is one given: those runs are reviewed, not waiting.
        "state": params.choice(request.GET, "state", (review.WAITING, review.REVIEWED, review.ALL))
        or (review.REVIEWED if verdict else review.WAITING),
        "worker": params.choice(request.GET, "worker", selectors.worker_slugs()),
        "kind": params.choice(request.GET, "kind", Run.Kind.values),
        "score": params.choice(request.GET, "score", review.SCORES),
        "verdict": verdict,
    }
    rows, next_page = page(request, review.review_queue(**filters), QueueCursorPagination)
    return render(
        request,
        "routing/review_queue.html",
        {
            "runs": rows,
            "next_page": next_page,
            "filters": filters,
            "states": [(review.REVIEWED, "Reviewed"), (review.ALL, "All")],  # the default: waiting
            "workers": selectors.worker_slugs(),
            "kinds": Run.Kind.choices,
            "scores": [("right", "Scored right"), ("wrong", "Scored wrong"), ("unscored", "Not scored")],
            "verdicts": Annotation.Verdict.choices,
        },
    )


@require_POST
@role_required(*review.REVIEWERS)
def annotate(request: HttpRequest, run_id: int) -> HttpResponse:
    """A verdict from the task page's review form; back to the run on its task's page. A verdict that
    cannot be recorded as given (a step that is not one of the run's, say) is refused: 400, with why."""
    try:
        verdict = review.Verdict(
            run_id=run_id,
            verdict=request.POST.get("verdict", ""),
            label=request.POST.get("label", ""),
            comment=request.POST.get("comment", ""),
            step_id=review.step_id(request.POST.get("step")),  # blank: the run's answer
        )
        annotation = review.annotation_add(verdict=verdict, user=request.user)
    except review.NoSuchRun as exc:
        messages.error(request, f"Not recorded: {exc}")
        return redirect("review:queue")
    except review.ReviewError as exc:
        return render(
            request,
            "400.html",
            {"message": f"Not recorded: {exc}.", "back": _run_on_its_page(run_id), "back_label": "the run"},
            status=400,
        )
    messages.success(request, f"Recorded: run {run_id} marked {annotation.get_verdict_display().lower()}.")
    return redirect(_run_on_its_page(run_id))


def _run_on_its_page(run_id: int) -> str:
    task_id = Run.objects.filter(pk=run_id).values_list("task_id", flat=True).first()
    return f"{reverse('routing:task-detail', args=[task_id])}#run-{run_id}"
