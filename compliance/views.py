"""Pages for auditors: event log, policy report, verification, exports, API tokens. The pages about
tasks (dossier, vendor exposure, legal holds) are in compliance.dossier_views."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django import forms
from django.conf import settings
from django.contrib import messages
from django.core.validators import MaxValueValidator
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone

from accounts.models import Role
from accounts.roles import AUDIT_ROLES, EVERYONE, role_required, user_roles
from accounts.tokens import tokens_visible
from audit import signing
from audit.actions import Action
from audit.exports import EXPORT_FORMATS, checkpoint_reference, export_response
from audit.filters import AuditEventFilter
from audit.grants import token_create, token_revoke
from audit.services import Actor, event_record
from audit.verify import verify
from utilities import params
from utilities.pagination import page

from . import selectors
from .pagination import EventCursorPagination


@role_required(*AUDIT_ROLES)
def event_log(request: HttpRequest) -> HttpResponse:
    events = AuditEventFilter(request.GET)
    rows, next_page = page(request, events.qs, EventCursorPagination)
    return render(
        request,
        "audit/event_log.html",
        {
            "events": rows,
            "next_page": next_page,
            "filters": request.GET,
            "query": urlencode(events.applied()),
        },
    )


@role_required(*AUDIT_ROLES)
def export_events(request: HttpRequest, fmt: str) -> StreamingHttpResponse:
    if fmt not in EXPORT_FORMATS:
        raise Http404("exports are .csv or .jsonl")
    return export_response(request, fmt, via="page")


def with_transaction_event(
    request: HttpRequest, action: str, *, payload: dict[str, Any], obj: Any = None
) -> None:

    with transaction.atomic():
        event_record(
            actor=Actor.for_user(request.user), action=action, obj=obj or request.user, payload=payload
        )


@role_required(*AUDIT_ROLES)
def policy_report(request: HttpRequest) -> HttpResponse:
    since, until = params.period(request.GET)
    return render(
        request,
        "audit/policy_report.html",
        {
            "rules": selectors.policy_rules(),
            "events": selectors.policy_events(since=since, until=until),
            "shown": selectors.POLICY_EVENTS_SHOWN,
            "filters": request.GET,
        },
    )


@role_required(*AUDIT_ROLES)
def verify_page(request: HttpRequest) -> HttpResponse:
    report = None
    if request.method == "POST":
        report = verify()
        with_transaction_event(
            request, Action.AUDIT_VERIFIED, payload={"intact": report.intact, "summary": report.summary()}
        )
    return render(
        request,
        "audit/verify.html",
        {"report": report, "checkpoint": checkpoint_reference(), "public_key": signing.public_key_offered()},
    )


@role_required(*AUDIT_ROLES)
def public_key_download(request: HttpRequest) -> HttpResponse:
    """The public key verification trusts, as a PEM file: what `python -m audit.bundle verify` takes."""
    offered = signing.public_key_offered()
    if offered is None:
        raise Http404("no audit signing key yet")
    response = HttpResponse(offered["pem"], content_type="application/x-pem-file")
    response["Content-Disposition"] = 'attachment; filename="audit-public.pem"'
    return response


# --- API tokens ---------------------------------------------------------------------------------


TOKENS_LISTED = 500  # the newest; the admin site lists and searches every one


class TokenCreateForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="What it is for, e.g. the script that uses it")
    role = forms.ChoiceField(help_text="The token acts with this role only")
    days = forms.IntegerField(min_value=1, label="Valid for (days)")

    def __init__(self, *args: Any, roles: list[str], **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.fields["role"].choices = [(r, Role(r).label) for r in roles]
        days = self.fields["days"]
        days.validators.append(MaxValueValidator(settings.API_TOKEN_MAX_DAYS))
        days.widget.attrs["max"] = settings.API_TOKEN_MAX_DAYS
        days.initial = settings.API_TOKEN_DEFAULT_DAYS
        days.help_text = f"At most {settings.API_TOKEN_MAX_DAYS}"


@role_required(*EVERYONE)
def tokens(request: HttpRequest) -> HttpResponse:
    """Your API tokens (every user's for the admin role): make one (shown once, in this response
    only), revoke one. Both are audit events (`token.created`, `token.revoked`)."""
    user = request.user
    held = [r for r in Role.values if r in user_roles(user)]
    form = TokenCreateForm(roles=held)
    issued = None
    status = 200
    if request.method == "POST":
        action = request.POST.get("action", "create")
        if action == "revoke":
            token_id = request.POST.get("token", "")
            token = (
                tokens_visible(user).filter(pk=int(token_id)).first()
                if token_id.isdecimal() and len(token_id) <= 18
                else None
            )
            if token is None:
                raise Http404("No such token")
            if token_revoke(token=token, actor=Actor.for_user(user)):
                messages.success(request, f"Token {token.prefix}… ({token.name}) is revoked.")
            return redirect("audit:tokens")
        if action != "create":
            return HttpResponse("action must be create or revoke", status=400, content_type="text/plain")
        form = TokenCreateForm(request.POST, roles=held)
        if form.is_valid():
            data = form.cleaned_data
            issued = token_create(
                user=user,
                role=data["role"],
                name=data["name"],
                days=data["days"],
                actor=Actor.for_user(user),
            )
            form = TokenCreateForm(roles=held)
        else:
            status = 400
    rows = tokens_visible(user).order_by("-created_at", "-id")[:TOKENS_LISTED]
    response = render(
        request,
        "audit/tokens.html",
        {
            "form": form,
            "issued": issued,
            "rows": rows,
            "all_users": Role.ADMIN in user_roles(user),
            "now": timezone.now(),
        },
        status=status,
    )
    if issued is not None:
        response["Cache-Control"] = "no-store"  # the token is in this page: keep it out of caches
    return response
