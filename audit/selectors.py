"""Reads for auditors: the policy report (policy events and rules). The event log filters in audit.filters."""

from __future__ import annotations

from datetime import datetime

from .models import POLICY_EVENT, AuditEvent, PolicyRule


def policy_events(*, since: datetime | None, until: datetime | None, limit: int = 500) -> list[AuditEvent]:
    """Blocks (plans and steps stopped by a rule) and changes to the rules, newest first."""
    qs = AuditEvent.objects.filter(POLICY_EVENT)
    if since:
        qs = qs.filter(occurred_at__gte=since)
    if until:
        qs = qs.filter(occurred_at__lt=until)
    return list(qs.order_by("-id")[:limit])


def policy_rules() -> list[PolicyRule]:
    return list(PolicyRule.objects.all())
