"""Logins, logouts and failed logins as audit events, and the login throttle (django-axes) they rely on.

The throttle locks a username after LOGIN_FAILURES_PER_USER failures from anywhere, and an IP address
after LOGIN_FAILURES_PER_IP failures on any usernames, each for LOGIN_LOCKOUT_MINUTES after its last
failure. A login refused while locked is not tried, not counted and not recorded.

Failed logins reach the global audit chain bounded: the first failure of each (username, address) in a
cool-off window is an `auth.login_failed` event, the failure that starts a lock is one `auth.locked_out`
event with the counts, and the other failures are only counted (by axes). Every recorded failure is
counted against its address, so one address adds at most LOGIN_FAILURES_PER_IP events per cool-off
window, however many usernames it tries.
"""

from __future__ import annotations

import ipaddress
import math

from axes.attempts import get_cool_off_threshold
from axes.handlers.database import AxesDatabaseHandler
from axes.helpers import get_client_username
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed
from django.db import transaction
from django.db.models import Max, Q, Sum
from django.shortcuts import render
from django.utils import timezone

from .actions import Action
from .services import Actor, event_record

# A failed login's username is whatever the client sent: events keep this many characters of it.
USERNAME_CHARS = 64


def _limits() -> dict[str, int]:
    return {"username": settings.LOGIN_FAILURES_PER_USER, "ip_address": settings.LOGIN_FAILURES_PER_IP}


def client_ip(request) -> str | None:
    """AXES_CLIENT_IP_CALLABLE: REMOTE_ADDR, or behind LOGIN_PROXY_COUNT proxies the address that the
    outermost one saw (X-Forwarded-For read from the right; what a client put on its left is not trusted).
    An IPv6 address counts as its /64: one client holds a whole /64, and would otherwise get a fresh
    failure budget (and fresh audit events) from each of its 2^64 addresses."""
    address = request.META.get("REMOTE_ADDR", "")
    count = settings.LOGIN_PROXY_COUNT
    if count:
        hops = [hop.strip() for hop in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if hop.strip()]
        if len(hops) >= count:
            address = hops[-count]
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return request.META.get("REMOTE_ADDR") or None
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.ipv4_mapped is not None:
            return str(parsed.ipv4_mapped)
        return str(ipaddress.ip_network(f"{parsed}/64", strict=False).network_address)
    return str(parsed)


def _ip(request) -> str:
    if request is None:
        return ""
    return getattr(request, "axes_ip_address", None) or request.META.get("REMOTE_ADDR", "")


def _clip(username: str) -> str:
    return username if len(username) <= USERNAME_CHARS else username[: USERNAME_CHARS - 1] + "…"


def failure_limit(request, credentials=None) -> int:
    """AXES_FAILURE_LIMIT: the limit of the count LoginThrottle.get_failures last returned."""
    return _limits()[getattr(request, "axes_limited_by", "username")]


class LoginThrottle(AxesDatabaseHandler):
    """axes' database handler with a limit per username and another per IP address."""

    def get_failures(self, request, credentials=None) -> int:
        username = get_client_username(request, credentials)
        recent = AccessAttempt.objects.filter(attempt_time__gte=get_cool_off_threshold(request))

        def count(**match) -> int:
            return recent.filter(**match).aggregate(n=Sum("failures_since_start"))["n"] or 0

        counts = {
            "username": count(username=username),
            "ip_address": count(ip_address=request.axes_ip_address),
        }
        request.axes_failures_by = counts
        request.axes_failures_of_pair = count(username=username, ip_address=request.axes_ip_address)
        # The count nearest its own limit: it reaches failure_limit() exactly when either count reaches its.
        limits = _limits()
        request.axes_limited_by = max(counts, key=lambda name: counts[name] / limits[name])
        return counts[request.axes_limited_by]

    def reset_user_attempts(self, request, credentials=None) -> int:
        """After a successful login: forget this username's failures from this address only (the default
        would also forget the address's failures on other usernames, and other addresses' on this one)."""
        username = get_client_username(request, credentials)
        deleted, _ = AccessAttempt.objects.filter(
            username=username, ip_address=request.axes_ip_address
        ).delete()
        return deleted


def lockout_response(request, original_response=None, credentials=None):
    """AXES_LOCKOUT_CALLABLE: the login page saying the login is locked, and for how long (429)."""
    username = get_client_username(request, getattr(request, "axes_credentials", None)) or ""
    counts = getattr(request, "axes_failures_by", {})
    limits = _limits()
    locked = [name for name, limit in limits.items() if counts.get(name, 0) >= limit] or list(limits)
    match = Q()
    for name in locked:
        match |= Q(username=username) if name == "username" else Q(ip_address=_ip(request))
    cool_off = settings.AXES_COOLOFF_TIME
    last = AccessAttempt.objects.filter(match, attempt_time__gte=timezone.now() - cool_off).aggregate(
        t=Max("attempt_time")
    )["t"]
    # The lock ends at the latest when the last failure it counts is older than the cool-off.
    left = (last + cool_off - timezone.now()).total_seconds() if last else cool_off.total_seconds()
    minutes = max(1, math.ceil(left / 60))
    context = {
        "locked_out": True,
        "locked_by_user": "username" in locked,
        "locked_by_ip": "ip_address" in locked,
        "lock_minutes": minutes,
    }
    response = render(request, "registration/login.html", context, status=429)
    response["Retry-After"] = str(minutes * 60)
    return response


def on_login(sender, request, user, **kwargs) -> None:
    with transaction.atomic():
        event_record(
            actor=Actor.for_user(user), action=Action.AUTH_LOGIN, obj=user, payload={"ip": _ip(request)}
        )


def on_logout(sender, request, user, **kwargs) -> None:
    if user is None:
        return
    with transaction.atomic():
        event_record(
            actor=Actor.for_user(user), action=Action.AUTH_LOGOUT, obj=user, payload={"ip": _ip(request)}
        )


def on_login_failed(sender, credentials, request=None, **kwargs) -> None:
    """A failed login as an event, when it is the first of its (username, address) in the window or starts
    a lock (axes' handler ran first and counted it); otherwise nothing is recorded."""
    counts = getattr(request, "axes_failures_by", None) if request is not None else None
    if request is not None and getattr(request, "axes_locked_out", False):
        if getattr(request, "axes_failures_since_start", None) is None:
            return  # refused unchecked while locked: the lock's event stands for it
        action = Action.AUTH_LOCKED_OUT
    elif counts is None or getattr(request, "axes_failures_of_pair", 1) <= 1:
        action = Action.AUTH_LOGIN_FAILED
    else:
        return  # a repeat of this (username, address) in the window: counted by axes, not recorded
    username = _clip(str(credentials.get("username", "")))
    user_model = get_user_model()
    user = user_model.objects.filter(username=credentials.get("username", "")).first()
    payload = {"ip": _ip(request), "username": username, "known_user": user is not None}
    if counts is not None:
        payload["failures"] = counts["username"]  # this username's, from any address, in the window
    if action == Action.AUTH_LOCKED_OUT:
        limits = _limits()
        payload["failures_ip"] = counts["ip_address"]  # this address's, on any usernames
        payload["locked"] = [name for name in ("username", "ip_address") if counts[name] >= limits[name]]
        payload["locked_for_s"] = int(settings.AXES_COOLOFF_TIME.total_seconds())
    with transaction.atomic():
        event_record(
            actor=Actor(type="user", id=str(user.pk) if user else "", name=username or "anonymous"),
            action=action,
            obj=user if user is not None else user_model(pk=0),
            payload=payload,
        )


def connect() -> None:
    user_logged_in.connect(on_login, dispatch_uid="audit-login")
    user_logged_out.connect(on_logout, dispatch_uid="audit-logout")
    user_login_failed.connect(on_login_failed, dispatch_uid="audit-login-failed")
