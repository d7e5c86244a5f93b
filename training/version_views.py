"""ML staff's actions on conductor versions: promote (once its form's box is ticked), roll back,
shadow mode, and evaluate (a preview of its cost first). A refused evaluation re-renders the home
page with its form's errors (training.views.home_page)."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST

from accounts.models import Role
from accounts.roles import request_roles, role_required
from routing.errors import ServiceError
from routing.models import ConductorVersion
from utilities import params

from . import services
from .forms import EvaluateForm
from .models import Evaluation
from .views import WRITERS, actor_of, home_page


@require_POST
@role_required(*WRITERS)
def version_promote(request: HttpRequest, version_id: int) -> HttpResponse:
    """Promote a version, once its form's box was ticked (from an evaluation's page: its deltas
    confirmed, which go into the audit event)."""
    version = get_object_or_404(ConductorVersion, pk=version_id)
    evaluation = None
    back = redirect("training:home")
    evaluation_id = params.integer(request.POST, "evaluation", default=None, minimum=1, maximum=2**63 - 1)
    if evaluation_id is not None:
        evaluation = get_object_or_404(Evaluation, pk=evaluation_id, candidate=version)
        back = redirect("training:evaluation", evaluation_id=evaluation.pk)
    if not _confirmed(request):
        messages.error(
            request,
            "Not promoted: confirm the deltas first." if evaluation else "Not promoted: confirm it first.",
        )
        return back
    try:
        services.conductor_promote(
            version=version,
            actor=actor_of(request),
            evaluation=evaluation,
            override_reason=request.POST.get("override_reason", "")
            if request.POST.get("override") == "yes"
            else "",
            may_override=Role.ADMIN in request_roles(request),
        )
    except ServiceError as exc:
        messages.error(request, f"Not promoted: {exc}")
    else:
        messages.success(request, f"{version.name} is now the active conductor.")
    return back


def _confirmed(request: HttpRequest) -> bool:
    """The form's confirmation box (templates/training/confirm.html) was ticked: what a change of the
    active conductor needs before it is made."""
    return request.POST.get("confirm") == "yes"


@require_POST
@role_required(*WRITERS)
def version_rollback(request: HttpRequest) -> HttpResponse:
    if not _confirmed(request):
        messages.error(request, "Not rolled back: confirm the roll back first.")
        return redirect("training:home")
    try:
        version = services.conductor_rollback(actor=actor_of(request))
    except ServiceError as exc:
        messages.error(request, f"Not rolled back: {exc}")
    else:
        messages.success(request, f"Rolled back: {version.name} is the active conductor again.")
    return redirect("training:home")


@require_POST
@role_required(*WRITERS)
def version_shadow(request: HttpRequest, version_id: int) -> HttpResponse:
    version = get_object_or_404(ConductorVersion, pk=version_id)
    turn_on = request.POST.get("on") == "1"
    try:
        services.shadow_set(version=version if turn_on else None, actor=actor_of(request))
    except ServiceError as exc:
        messages.error(request, f"Shadow mode unchanged: {exc}")
    else:
        messages.success(
            request,
            f"{version.name} now plans live tasks in shadow mode." if turn_on else "Shadow mode is off.",
        )
    return redirect("training:home")


@require_POST
@role_required(*WRITERS)
def version_evaluate(request: HttpRequest, version_id: int) -> HttpResponse:
    """Evaluate a version against the active one (or the baseline chosen); with the "Preview" button (name="preview"), the same
    checks and the estimate of what starting would do, on the page with a button to start it."""
    version = get_object_or_404(ConductorVersion, pk=version_id)
    form = EvaluateForm(request.POST)
    if not form.is_valid():
        problems = "; ".join(
            " ".join(errs) if field == "__all__" else f"{field}: {' '.join(errs)}"
            for field, errs in form.errors.items()
        )
        messages.error(request, f"Not evaluated: {problems}")
        return redirect("training:home")
    if "preview" in request.POST:
        try:
            estimate = services.evaluation_estimate(
                candidate=version,
                baseline=form.cleaned_data["baseline"],
                split=form.cleaned_data["split"],
                limit=form.cleaned_data["limit"],
                item_set=form.cleaned_data["item_set"],
                user=request.user,
            )
        except ServiceError as exc:
            messages.error(request, f"Not evaluated: {exc}")
            return redirect("training:home")
        preview = {"version": version, **form.cleaned_data, "estimate": estimate}
        return home_page(request, evaluate_preview=preview)
    try:
        evaluation = services.evaluation_start(
            candidate=version,
            baseline=form.cleaned_data["baseline"],
            split=form.cleaned_data["split"],
            limit=form.cleaned_data["limit"],
            item_set=form.cleaned_data["item_set"],
            shown_usd=form.cleaned_data["shown_usd"],
            max_usd=form.cleaned_data["max_usd"],
            actor=actor_of(request),
            user=request.user,
        )
    except ServiceError as exc:
        messages.error(request, f"Not evaluated: {exc}")
        return redirect("training:home")
    return redirect("training:evaluation", evaluation_id=evaluation.pk)  # its page follows its status
