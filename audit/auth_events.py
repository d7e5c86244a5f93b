"""Logins, logouts and failed logins as audit events (Django reports them through auth signals)."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed
from django.db import transaction

from .services import Actor, event_record


def _ip(request) -> str:
    return request.META.get("REMOTE_ADDR", "") if request is not None else ""


def on_login(sender, request, user, **kwargs) -> None:
    with transaction.atomic():
        event_record(actor=Actor.for_user(user), action="auth.login", obj=user, payload={"ip": _ip(request)})


def on_logout(sender, request, user, **kwargs) -> None:
    if user is None:
        return
    with transaction.atomic():
        event_record(actor=Actor.for_user(user), action="auth.logout", obj=user, payload={"ip": _ip(request)})


def on_login_failed(sender, credentials, request=None, **kwargs) -> None:
    username = str(credentials.get("username", ""))[:150]
    user_model = get_user_model()
    user = user_model.objects.filter(username=username).first()
    with transaction.atomic():
        event_record(
            actor=Actor(type="user", id=str(user.pk) if user else "", name=username or "anonymous"),
            action="auth.login_failed",
            obj=user if user is not None else user_model(pk=0),
            payload={"ip": _ip(request), "username": username, "known_user": user is not None},
        )


def connect() -> None:
    user_logged_in.connect(on_login, dispatch_uid="audit-login")
    user_logged_out.connect(on_logout, dispatch_uid="audit-logout")
    user_login_failed.connect(on_login_failed, dispatch_uid="audit-login-failed")
