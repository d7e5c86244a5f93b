"""Reads for auditors: the policy report (policy events and rules). The event log filters in audit.filters."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models.fields.json import KT

from .models import POLICY_EVENT, AuditEvent, PolicyRule

POLICY_EVENTS_SHOWN = 200  # the newest; a period narrows to older ones


def policy_events(
    *, since: datetime | None, until: datetime | None, limit: int = POLICY_EVENTS_SHOWN
) -> list[dict[str, Any]]:
    """Blocks (plans and steps stopped by a rule) and changes to the rules, newest first: the columns
    the report shows, read through the index of policy events (audit.models.POLICY_EVENT), with the
    payload's fields picked in the database rather than each whole payload decoded."""
    qs = AuditEvent.objects.filter(POLICY_EVENT)
    if since:
        qs = qs.filter(occurred_at__gte=since)
    if until:
        qs = qs.filter(occurred_at__lt=until)
    return list(
        qs.order_by("-id")
        .annotate(
            blocked_by=KT("payload__blocked_by"),
            note=KT("payload__note"),
            error=KT("payload__error"),
            changed=KT("payload__changed"),
        )
        .values("id", "occurred_at", "action", "task_id", "blocked_by", "note", "error", "changed")[:limit]
    )


def policy_rules() -> list[PolicyRule]:
    return list(PolicyRule.objects.all())
