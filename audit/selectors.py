"""Reads for auditors: the event log with filters, the vendor exposure and policy reports, dossiers."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Q, QuerySet

from .actions import Action
from .models import AuditEvent, PolicyRule

PAGE = 100


@dataclass(frozen=True)
class EventFilter:
    action: str = ""
    actor: str = ""
    task_id: str = ""
    object_type: str = ""
    chain: str = ""
    q: str = ""
    since: datetime | None = None
    until: datetime | None = None

    def as_params(self) -> dict[str, str]:
        """The query parameters that select this filter (what the pages and exports read back)."""
        names = {"task_id": "task"}
        params = {names.get(k, k): v for k, v in self.__dict__.items() if isinstance(v, str) and v}
        if self.since:
            params["since"] = self.since.isoformat()
        if self.until:
            params["until"] = self.until.isoformat()
        return params


def events(flt: EventFilter) -> QuerySet[AuditEvent]:
    qs = AuditEvent.objects.all()
    if flt.action:
        qs = qs.filter(action__startswith=flt.action)
    if flt.actor:
        qs = qs.filter(actor_name=flt.actor)
    if flt.task_id:
        try:
            qs = qs.filter(task_id=uuid.UUID(flt.task_id))
        except ValueError:
            qs = qs.none()
    if flt.object_type:
        qs = qs.filter(object_type=flt.object_type)
    if flt.chain:
        qs = qs.filter(chain=flt.chain)
    if flt.q:
        qs = qs.filter(Q(object_id=flt.q) | Q(actor_name__icontains=flt.q) | Q(action__icontains=flt.q))
    if flt.since:
        qs = qs.filter(occurred_at__gte=flt.since)
    if flt.until:
        qs = qs.filter(occurred_at__lt=flt.until)
    return qs


def event_page(flt: EventFilter, *, before: int | None) -> tuple[list[AuditEvent], int | None]:
    """Newest first, keyset-paginated on the primary key: constant cost however deep the page."""
    qs = events(flt).order_by("-id")
    if before is not None:
        qs = qs.filter(id__lt=before)
    rows = list(qs[: PAGE + 1])
    next_before = rows[PAGE - 1].pk if len(rows) > PAGE else None
    return rows[:PAGE], next_before


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
