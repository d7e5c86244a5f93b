"""Auditors' pages about tasks: the dossier, vendor exposure and legal holds (read models in
routing.compliance)."""

from __future__ import annotations

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.loader import render_to_string
from django.utils import timezone
from django.views.decorators.http import require_POST

from audit import params, policies
from audit.models import Role
from audit.roles import AUDIT_ROLES, request_roles, role_required
from audit.services import Actor, legal_hold_place, legal_hold_release, record_viewed

from . import compliance, selectors
from .models import Task


@role_required(*AUDIT_ROLES)
def dossier(request: HttpRequest, task_id) -> HttpResponse:
    try:
        task = selectors.task_detail(task_id=task_id)
    except Task.DoesNotExist as exc:
        raise Http404("No such task") from exc
    context = compliance.dossier_context(task)
    if request.GET.get("download"):
        record_viewed(request=request, task=task, view="dossier export")
        css = (settings.BASE_DIR / "static" / "css" / "app.css").read_text()
        html = render_to_string(
            "audit/dossier_file.html",
            {
                **context,
                "css": css,
                "exported_at": timezone.now(),
                "exported_by": request.user.get_username(),
            },
        )
        response = HttpResponse(html, content_type="text/html; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="dossier-{task.pk}.html"'
        return response
    record_viewed(request=request, task=task, view="dossier")
    return render(
        request, "audit/dossier.html", {**context, "can_hold": Role.ADMIN in request_roles(request)}
    )


@require_POST
@role_required(Role.ADMIN)
def hold(request: HttpRequest, task_id) -> HttpResponse:
    task = get_object_or_404(Task, pk=task_id)
    actor = Actor.for_user(request.user)
    if request.POST.get("action") == "release":
        legal_hold_release(task=task, actor=actor)
    else:
        legal_hold_place(task=task, actor=actor, reason=request.POST.get("reason", "").strip() or "not given")
    return redirect("compliance:dossier", task_id=task.pk)


@role_required(*AUDIT_ROLES)
def vendor_report(request: HttpRequest) -> HttpResponse:
    since, until = params.period(request.GET)
    rows = compliance.vendor_exposure(since=since, until=until)
    vendor = params.text(request.GET, "vendor")
    classification = params.choice(request.GET, "classification", policies.data_classes())
    tasks = (
        compliance.vendor_tasks(vendor=vendor, classification=classification, since=since, until=until)
        if vendor and classification
        else None
    )
    return render(
        request,
        "audit/vendor_report.html",
        {
            "rows": rows,
            "tasks": tasks,
            "vendor": vendor,
            "classification": classification,
            "filters": request.GET,
        },
    )
