"""Reads for auditors: the event log with filters, the vendor exposure and policy reports, dossiers."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db.models import Count, OuterRef, Q, QuerySet, Subquery, Sum

from routing.models import Step, StepStatus, Task

from .chain import run_chain
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


def vendor_exposure(*, since: datetime | None, until: datetime | None) -> list[dict[str, Any]]:
    """Which vendors received data of which classification: steps that reached a vendor (any call made),
    and answers sent to an LLM judge for grading (with the task and its reference)."""
    qs = Step.objects.exclude(vendor="").exclude(status=StepStatus.PENDING).filter(started_at__isnull=False)
    if since:
        qs = qs.filter(started_at__gte=since)
    if until:
        qs = qs.filter(started_at__lt=until)
    rows = {
        (r["vendor"], r["run__task__classification"]): {**r, "judged": 0}
        for r in qs.values("vendor", "run__task__classification").annotate(
            tasks=Count("run__task", distinct=True),
            steps=Count("id"),
            input_tokens=Sum("input_tokens"),
            output_tokens=Sum("output_tokens"),
            cost=Sum("cost_usd"),
        )
    }
    judged_tasks: dict[tuple[str, str], set[Any]] = {}
    for event in _judge_calls(since, until):
        key = (event.payload["vendor"], event.classification)
        row = rows.setdefault(
            key,
            {
                "vendor": key[0],
                "run__task__classification": key[1],
                "tasks": 0,
                "steps": 0,
                "input_tokens": 0,
                "output_tokens": 0,
                "cost": Decimal("0"),
                "judged": 0,
            },
        )
        row["judged"] += 1
        row["input_tokens"] += int(event.payload.get("input_tokens") or 0)
        row["output_tokens"] += int(event.payload.get("output_tokens") or 0)
        row["cost"] += Decimal(str(event.payload.get("cost_usd") or "0"))
        judged_tasks.setdefault(key, set()).add(event.task_id)
    for key, task_ids in judged_tasks.items():  # tasks counted once, steps or judge
        seen = set(
            qs.filter(vendor=key[0], run__task__classification=key[1]).values_list("run__task", flat=True)
        )
        rows[key]["tasks"] = len(seen | task_ids)
    return [rows[key] for key in sorted(rows)]


def _judge_calls(since: datetime | None, until: datetime | None) -> QuerySet[AuditEvent]:
    """score.judged events where the judge was really asked (it was sent the task and the answer)."""
    qs = AuditEvent.objects.filter(action="score.judged", payload__input_tokens__gt=0).exclude(
        payload__vendor=""
    )
    if since:
        qs = qs.filter(occurred_at__gte=since)
    if until:
        qs = qs.filter(occurred_at__lt=until)
    return qs.annotate(
        classification=Subquery(Task.objects.filter(pk=OuterRef("task_id")).values("classification")[:1])
    )


def vendor_tasks(
    *, vendor: str, classification: str, since: datetime | None, until: datetime | None, limit: int = 200
) -> list[Task]:
    qs = Task.objects.filter(
        runs__steps__vendor=vendor, classification=classification, runs__steps__started_at__isnull=False
    )
    if since:
        qs = qs.filter(runs__steps__started_at__gte=since)
    if until:
        qs = qs.filter(runs__steps__started_at__lt=until)
    judged = {
        e.task_id
        for e in _judge_calls(since, until).filter(payload__vendor=vendor)
        if e.classification == classification
    }
    return list(
        Task.objects.filter(Q(pk__in=qs.values("pk")) | Q(pk__in=judged))
        .distinct()
        .order_by("-created_at")[:limit]
    )


def policy_events(*, since: datetime | None, until: datetime | None, limit: int = 500) -> list[AuditEvent]:
    """Blocks (plans and steps stopped by a rule) and changes to the rules, newest first."""
    qs = AuditEvent.objects.filter(
        Q(action="plan.blocked")
        | Q(action__startswith="policyrule.")
        | Q(action="step.failed", payload__note__startswith="policy")
        | Q(action="run.failed", payload__stop_reason="policy_blocked")
    )
    if since:
        qs = qs.filter(occurred_at__gte=since)
    if until:
        qs = qs.filter(occurred_at__lt=until)
    return list(qs.order_by("-id")[:limit])


def policy_rules() -> list[PolicyRule]:
    return list(PolicyRule.objects.all())


def task_chains(task: Task) -> list[str]:
    return [run_chain(run.correlation_id) for run in task.runs.all()]


def task_events(task: Task) -> QuerySet[AuditEvent]:
    return AuditEvent.objects.filter(task_id=task.pk).order_by("id")
