"""Reads for auditors: the policy report (policy events and rules). The event log filters in audit.filters."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Q

from .actions import Action
from .models import AuditEvent, PolicyRule


def policy_events(*, since: datetime | None, until: datetime | None, limit: int = 500) -> list[AuditEvent]:
    """Blocks (plans and steps stopped by a rule) and changes to the rules, newest first."""
    qs = AuditEvent.objects.filter(
        Q(action=Action.PLAN_BLOCKED)
        | Q(action__startswith="policyrule.")
        | Q(action=Action.STEP_FAILED, payload__note__startswith="policy")
        | Q(action=Action.RUN_FAILED, payload__stop_reason="policy_blocked")
    )
    if since:
        qs = qs.filter(occurred_at__gte=since)
    if until:
        qs = qs.filter(occurred_at__lt=until)
    return list(qs.order_by("-id")[:limit])


def policy_rules() -> list[PolicyRule]:
    return list(PolicyRule.objects.all())
