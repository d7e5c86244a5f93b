"""Auditors' pages about tasks: the dossier, vendor exposure and legal holds (read models in
compliance.dossiers)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.loader import render_to_string
from django.utils import timezone
from django.views.decorators.http import require_POST

from accounts.models import Role
from accounts.roles import AUDIT_ROLES, request_roles, role_required
from audit import policies
from audit.services import Actor, legal_hold_place, legal_hold_release, record_viewed
from routing import selectors
from routing.models import Task
from utilities import params

from . import dossiers
from .dossier_bundle import dossier_bundle


@role_required(*AUDIT_ROLES)
def dossier(request: HttpRequest, task_id) -> HttpResponse:
    try:
        task = selectors.task_detail(task_id=task_id)
    except Task.DoesNotExist as exc:
        raise Http404("No such task") from exc
    download = params.choice(request.GET, "download", ("1", "html", "pdf", "bundle"))
    if download == "bundle":
        record_viewed(request=request, task=task, view="dossier export (bundle)")
        bundle = dossier_bundle(task, exported_by=request.user.get_username())
        response = JsonResponse(bundle, json_dumps_params={"indent": 1, "ensure_ascii": False})
        response["Content-Disposition"] = f'attachment; filename="dossier-{task.pk}.json"'
        return response
    context = dossiers.dossier_context(task)
    if download:
        pdf = download == "pdf"
        html = render_to_string(
            "audit/dossier_file.html",
            {
                **context,
                "css": (settings.BASE_DIR / "static" / "css" / "app.css").read_text(),
                "exported_at": timezone.now(),
                "exported_by": request.user.get_username(),
                "pdf": pdf,
            },
        )
        if pdf:
            try:
                body = dossier_pdf(html, base_url=request.build_absolute_uri("/"))
            except OSError as exc:  # WeasyPrint could not load Pango
                return HttpResponse(
                    f"The PDF export needs Pango on the server (make pango): {exc}",
                    status=503,
                    content_type="text/plain; charset=utf-8",
                )
            record_viewed(request=request, task=task, view="dossier export (PDF)")
            response = HttpResponse(body, content_type="application/pdf")
        else:
            record_viewed(request=request, task=task, view="dossier export")
            response = HttpResponse(html, content_type="text/html; charset=utf-8")
        response["Content-Disposition"] = (
            f'attachment; filename="dossier-{task.pk}.{"pdf" if pdf else "html"}"'
        )
        return response
    record_viewed(request=request, task=task, view="dossier")
    return render(
        request, "audit/dossier.html", {**context, "can_hold": Role.ADMIN in request_roles(request)}
    )


def _no_fetching(url: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
    raise ValueError(f"the dossier's PDF loads nothing from outside itself ({url[:80]})")


def dossier_pdf(html: str, *, base_url: str | None = None) -> bytes:
    """The exported dossier (one self-contained HTML document, its CSS inline) as PDF, by WeasyPrint;
    nothing is fetched while rendering. Its links (to the exact messages a step sent) are made
    absolute against `base_url`, so they open the app from the file."""
    import weasyprint  # imported here: it loads Pango, which only this export needs

    return weasyprint.HTML(string=html, base_url=base_url, url_fetcher=_no_fetching).write_pdf()


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
    rows = dossiers.vendor_exposure(since=since, until=until)
    vendor = params.text(request.GET, "vendor")
    classification = params.choice(request.GET, "classification", policies.data_classes())
    tasks = (
        dossiers.vendor_tasks(vendor=vendor, classification=classification, since=since, until=until)
        if vendor and classification
        else None
    )
    return render(
        request,
        "audit/vendor_report.html",
        {
            "rows": rows,
            "flows": dossiers.exposure_flows(rows),
            "tasks": tasks,
            "vendor": vendor,
            "classification": classification,
            "filters": request.GET,
        },
    )
