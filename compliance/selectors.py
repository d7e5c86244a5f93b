"""Reads for auditors: the policy report (policy events and rules). The event log filters in audit.filters."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Case, CharField, F, OuterRef, Q, Subquery, When
from django.db.models.fields.json import KT
from django.db.models.functions import Cast, Coalesce

from audit.models import POLICY_EVENT, AuditEvent, PolicyRule
from audit.templatetags.display import plain

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
    is_rule_event = Q(action__startswith="policyrule.")
    # A rule's name as its event recorded it; events written before they recorded it: its name now.
    rule_name_now = Subquery(
        PolicyRule.objects.annotate(key=Cast("pk", CharField()))
        .filter(key=OuterRef("object_id"))
        .values("name")[:1]
    )
    rows = list(
        qs.order_by("-id")
        .annotate(
            blocked_by=KT("payload__blocked_by"),
            note=KT("payload__note"),
            error=KT("payload__error"),
            changed=KT("payload__changed"),
            rule=Case(
                When(
                    is_rule_event, then=Coalesce(KT("payload__name"), rule_name_now, output_field=CharField())
                )
            ),
            # What a rule's event recorded of it (only those payloads are read whole).
            rule_values=Case(When(is_rule_event, then=F("payload"))),
        )
        .values(
            "id",
            "occurred_at",
            "action",
            "task_id",
            "blocked_by",
            "note",
            "error",
            "changed",
            "rule",
            "rule_values",
        )[:limit]
    )
    for row in rows:
        row["rule_detail"] = rule_detail(row.pop("rule_values"))
    return rows


RULE_FIELDS = ("kind", "data_classes", "vendors", "regions", "enabled")


def rule_detail(payload: dict[str, Any] | None) -> str:
    """A rule's values as its event recorded them, as a person reads them (`vendors → openai; …`);
    events of the admin site that recorded only what changed, as they recorded it."""
    if payload is None:
        return ""
    values = {field: payload[field] for field in RULE_FIELDS if field in payload}
    return plain(values or payload.get("changed") or {})


def policy_rules() -> list[PolicyRule]:
    return list(PolicyRule.objects.all())
