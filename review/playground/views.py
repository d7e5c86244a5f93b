"""The playground's page: choose a variation of a task, see what it would cost, run it."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse

from accounts.roles import role_required
from audit.services import record_viewed
from review.playground import services
from routing.models import ConductorVersion, Step, Task, Worker
from utilities import params


def _variation(request: HttpRequest, task_id) -> services.Variation:
    """The variation the form asks for. On GET (a link prefilling the form) each value is read strictly
    (an unknown worker or conductor is a 400); a posted form gets the service's reasons in the page."""
    source = request.POST if request.method == "POST" else request.GET
    step = params.integer(source, "step", default=None, minimum=1, maximum=2**63 - 1)
    by_conductor = params.choice(source, "mode", ("worker", "conductor")) == "conductor"
    if request.method == "POST":
        worker, conductor = params.text(source, "worker"), params.text(source, "conductor")
    else:
        worker = params.choice(
            source, "worker", Worker.objects.filter(enabled=True).values_list("slug", flat=True)
        )
        conductor = params.choice(
            source, "conductor", ConductorVersion.objects.values_list("name", flat=True)
        )
    return services.Variation(
        task_id=task_id,
        conductor=conductor if by_conductor else "",
        worker="" if by_conductor else worker,
        instruction="" if by_conductor else source.get("instruction", ""),
        step_id=step,
    )


@role_required(*services.PLAYERS)
def playground_page(request: HttpRequest, task_id) -> HttpResponse:
    """GET: the form (from a step: its worker and instruction filled in). POST `preview`: the estimate,
    and a button to run it; POST `run`: start it and go to the task's page."""
    task = Task.objects.filter(pk=task_id).first()
    if task is None:
        raise Http404("No such task")
    variation = _variation(request, task_id)
    prepared, error = None, ""
    if request.method == "POST":
        try:
            prepared = services.prepare(variation)
        except services.PlaygroundError as exc:
            error = str(exc)
        if prepared is not None and request.POST.get("action") == "run":
            shown = _shown_estimate(request.POST.get("estimated_usd", ""))
            if request.POST.get("priced") != prepared.fingerprint:  # changed after its cost was shown
                error = "what would run changed since its cost was shown; check the new cost below"
            else:
                run = services.playground_run(variation=variation, user=request.user, estimated_usd=shown)
                messages.success(request, f"Playground run {run.pk} is queued: {prepared.described}.")
                return redirect(f"{reverse('routing:task-detail', args=[task.pk])}#run-{run.pk}")
    if request.method == "GET":
        record_viewed(request=request, task=task, view="playground")
    step = Step.objects.filter(pk=variation.step_id, run__task=task).first() if variation.step_id else None
    return render(
        request,
        "routing/playground.html",
        {
            "task": task,
            "step": step,
            "mode": "conductor" if variation.conductor else "worker",
            "worker": variation.worker or (step.worker_slug if step else ""),
            "instruction": variation.instruction or (step.instruction if step else task.text),
            "conductor": variation.conductor,
            "workers": list(
                Worker.objects.filter(enabled=True).order_by("slug").values_list("slug", flat=True)
            ),
            "conductors": list(ConductorVersion.objects.order_by("name").values_list("name", flat=True)),
            "prepared": prepared,
            "error": error,
        },
        status=400 if error else 200,
    )


def _shown_estimate(value: str) -> Decimal | None:
    try:
        shown = Decimal(value) if value else None
    except InvalidOperation:
        return None
    return shown if shown is not None and shown.is_finite() else None
